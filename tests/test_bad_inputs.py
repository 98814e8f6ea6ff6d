"""Bad input through the real CLI (`sentinel.cli.main`): every command, every file it reads or
writes, and the inputs an operator gets wrong. Each must end in one line saying what is wrong
(`sentinel: ...`, or argparse's `error:` for a malformed flag) and exit 2: never a traceback,
never silence. A file option added to a command without a row here fails
`test_every_file_option_is_in_the_table`.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.cli import build_parser, main
from tests.test_cli_conventions import parsers

ROOT = Path(__file__).resolve().parents[1]
COORD = "http://127.0.0.1:9"  # nothing listens there: a case that got as far would not hang
JOB = f"--job-id j1 --nodes 1 --gpus-per-node 1 --coordinator {COORD}"
TRAINER = f"-- {sys.executable} -c pass"
AGENT = "agent --sim --listen 127.0.0.1:0"

# The files each command reads: its argv, {} where the bad file goes. Outputs are in OUTPUTS.
READS: dict[str, str] = (
    {
        "config check FILE": "config check {}",
        "agent --config": "agent --sim --config {}",
        "agent --sim-faults": f"{AGENT} --sim-faults {{}}",
        "coordinator --config": "coordinator --config {}",
        "coordinator --playbooks": "coordinator --state-dir {tmp}/st --playbooks {}",
        "playbooks check DIR": "playbooks check {}",
        "playbooks check --config": "playbooks check {playbooks} --config {}",
        "rules score --corpus": "rules score --corpus {}",
        "rules score --playbooks": "rules score --corpus {corpus} --playbooks {}",
        "token create --config": "token create --role admin --config {}",
        "token revoke --config": "token revoke x --config {}",
        "token list --config": "token list --config {}",
        "run --config": f"run {JOB} --config {{}} {TRAINER}",
        "run --token-file": f"run {JOB} --token-file {{}} {TRAINER}",
        "run --exclude-file": f"run {JOB} --token-file {{token}} --exclude-file {{}} {TRAINER}",
        "goodput --trace": "goodput --trace {}",
        "goodput --measurements": "goodput --measurements {}",
        "goodput --from-demo": "goodput --from-demo {}",
        "goodput --recovery-bench": "goodput --recovery-bench {}",
        "fr analyze DIR": "fr analyze {}",
        "burnin --scenario": "burnin --scenario {}",
        "burnin --baseline": "burnin --sim-nodes 2 --baseline {}",
        "burnin --sim-faults": "burnin --validate --save-baseline {tmp}/b.json --sim-faults {}",
        "demo --scenario": "demo --scenario {}",
        "dashboards burnin-textfile REPORT": "dashboards burnin-textfile {}",
        "dashboards push --dir": f"dashboards push --url {COORD} --dir {{}}",
        "status --token-file": f"status --coordinator {COORD} --token-file {{}}",
        "stacks --token-file": f"stacks j1 --coordinator {COORD} --token-file {{}}",
        "fleet drift --token-file": f"fleet drift --coordinator {COORD} --token-file {{}}",
        "incident bundle --token-file": f"incident bundle 1 --coordinator {COORD} --token-file {{}}",
    }
    | {
        f"incident {verb} --token-file": f"incident {verb} 1 {extra} --coordinator {COORD} --token-file {{}}"
        for verb, extra in (
            ("ack", ""),
            ("approve", ""),
            ("resolve", ""),
            ("act", "notify --why x"),
        )
    }
    | {
        f"playbooks {verb} --token-file": f"playbooks {verb} {name} --coordinator {COORD} --token-file {{}}"
        for verb, name in (("list", ""), ("shadow", "straggler"), ("act", "straggler"))
    }
)
ALL_KINDS = ("missing", "binary", "utf16", "directory")
# A fault file the simulated GPUs watch: missing is no fault yet, and its lines are read as the
# injector appends them (a bad line is skipped, said once); only a directory cannot be one.
KINDS = {"agent --sim-faults": ("directory",), "burnin --sim-faults": ("directory",)}
DIRECTORY_INPUTS = ("DIR", "--dir", "--playbooks", "--corpus")
# Where commands write: a path below a regular file can be neither created nor written.
OUTPUTS: dict[str, str] = {
    "agent --spool-dir": f"{AGENT} --coordinator {COORD} --config {{agent_token}} --spool-dir {{}}",
    "agent --rank-socket": f"{AGENT} --rank-socket {{}}",
    "coordinator --state-dir": "coordinator --listen 127.0.0.1:0 --state-dir {}",
    "token create --state-dir": "token create --role admin --state-dir {}",
    "token revoke --state-dir": "token revoke x --state-dir {}",
    "token list --state-dir": "token list --state-dir {}",
    "run --checkpoint-dir": f"run {JOB} --token-file {{token}} --checkpoint-dir {{}} {TRAINER}",
    "run --log-dir": f"run {JOB} --token-file {{token}} --log-dir {{}} {TRAINER}",
    "run --fr-dir": f"run {JOB} --token-file {{token}} --fr-dir {{}} {TRAINER}",
    "burnin --exclude-out": "burnin --sim-nodes 2 --exclude-out {}",
    "burnin --save-baseline": "burnin --sim-nodes 2 --save-baseline {}",
    "demo --out": "demo --quick --out {}",
    "dashboards burnin-textfile --out": "dashboards burnin-textfile {report} --out {}",
    "incident bundle -o": f"incident bundle 1 --coordinator {COORD} -o {{}}",
}


def _files(tmp: Path) -> dict[str, Path]:
    """The bad files every read is tried with."""
    (tmp / "binary").write_bytes(bytes(range(256)))
    (tmp / "utf16").write_bytes("fleet: {nodes: 2}\n".encode("utf-16"))
    (tmp / "a-directory").mkdir()
    return {
        "missing": tmp / "no-such-file",
        "binary": tmp / "binary",
        "utf16": tmp / "utf16",
        "directory": tmp / "a-directory",
    }


def _argv(template: str, path: Path, tmp: Path) -> list[str]:
    (tmp / "token").write_text("not-a-real-token\n")
    (tmp / "agent.yaml").write_text(f"agent:\n  token_file: {tmp / 'token'}\n")
    (tmp / "report.json").write_text('{"verdict": "pass"}\n')
    named = {"token": tmp / "token", "agent_token": tmp / "agent.yaml", "tmp": tmp}
    named |= {"report": tmp / "report.json", "playbooks": ROOT / "playbooks"}
    named |= {"corpus": ROOT / "corpus"}
    return [a.replace("{}", str(path)).format(**named) for a in template.split()]


LOG_LEVELS = ("DEBUG ", "INFO ", "WARNING ", "ERROR ")


def one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> str:
    """Run the CLI; what it said past its log lines (asserting the rest of the contract): one
    line, or a check's list of the problems it found, one a line."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        code = int(e.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    # refused before it said anything of its node (a daemon binds first, then reports)
    assert "node verdict" not in err and "agent ready" not in err, err
    said = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(LOG_LEVELS)]
    assert said, err
    return "\n".join(said)


@pytest.mark.parametrize(
    ("name", "kind"), [(n, k) for n in sorted(READS) for k in KINDS.get(n, ALL_KINDS)]
)
def test_an_unreadable_input_file_is_one_line_and_exit_2(
    name: str,
    kind: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _files(tmp_path)[kind]
    if kind == "directory" and name.split()[-1] in DIRECTORY_INPUTS:  # one of bad files, then
        (path / "bad.yaml").write_bytes(bytes(range(256)))
        (path / "bad.json").write_bytes(bytes(range(256)))
    line = one_line_and_exit_2(_argv(READS[name], path, tmp_path), capsys, monkeypatch)
    assert str(path) in line or path.name in line, line


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_an_output_below_a_regular_file_is_one_line_and_exit_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "out"
    line = one_line_and_exit_2(_argv(OUTPUTS[name], path, tmp_path), capsys, monkeypatch)
    assert "a-file" in line, line


def _file_options() -> Iterator[str]:
    """Every option or argument of every command that names a file or directory."""
    for path, p in parsers(build_parser()):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if action.type is Path or action.type is argparse.FileType:
                flag = action.option_strings[0] if action.option_strings else action.dest
                yield f"{' '.join(path)} {flag}"


def test_every_file_option_is_in_the_table() -> None:
    covered = {n.rsplit(" ", 1)[0] + " " + n.rsplit(" ", 1)[1] for n in {*READS, *OUTPUTS}}
    positional = {n.rsplit(" ", 1)[0] for n in {*READS, *OUTPUTS} if n.split()[-1].isupper()}
    missing = [
        o
        for o in _file_options()
        if o not in covered and o.rsplit(" ", 1)[0] not in positional and "--json" not in o
    ]
    assert missing == []


@pytest.fixture
def busy() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


STRAGGLER_BOOK = (ROOT / "playbooks/straggler.yaml").read_text()
LATE = (
    "fleet: {nodes: 1, gpus_per_node: 2, spares: 1}\ntrainer: {tp: 2, pp: 1, dp: 1, steps: 40}\n"
    "faults: [{kind: crash, rank: 0, at_step: 40}]\n"
)
# What an operator gets wrong: the argv, the files it names (in {tmp}), and words the refusal
# must contain.
WRONG: dict[str, tuple[str, dict[str, str], str]] = {
    "agent port out of range": ("agent --sim --listen 127.0.0.1:99999", {}, "65535"),
    "agent port in use": ("agent --sim --listen 127.0.0.1:{busy}", {}, "in use"),
    "agent without a token": (
        f"{AGENT} --coordinator {COORD} --spool-dir {{tmp}}/spool",
        {},
        "token_file",
    ),
    "coordinator port in use": (
        "coordinator --listen 127.0.0.1:{busy} --state-dir {tmp}/st",
        {},
        "in use",
    ),
    "coordinator ingest port in use": (
        "coordinator --listen 127.0.0.1:0 --ingest-listen 127.0.0.1:{busy} --state-dir {tmp}/st",
        {},
        "in use",
    ),
    "a trainer that does not exist": (
        f"run {JOB} --token-file {{tmp}}/token -- /no/such/trainer",
        {"token": "t\n"},
        "/no/such/trainer",
    ),
    "an empty token file": (
        f"status --coordinator {COORD} --token-file {{tmp}}/token",
        {"token": "\n"},
        "empty",
    ),
    "a fault after the last step": (
        "demo --scenario {tmp}/late.yaml",
        {"late.yaml": LATE},
        "never strike",
    ),
    "an empty scenario": ("demo --scenario {tmp}/empty.yaml", {"empty.yaml": ""}, "empty"),
    "a key twice in a scenario": (
        "demo --scenario {tmp}/dup.yaml",
        {"dup.yaml": "fleet: {nodes: 2}\nfaults: []\nfleet: {nodes: 4}\n"},
        "duplicate key 'fleet'",
    ),
    "a key twice in a config": (
        "config check {tmp}/dup.yaml",
        {"dup.yaml": "agent: {interval_s: 2}\nagent: {interval_s: 3}\n"},
        "duplicate key 'agent'",
    ),
    "a misspelt trigger field": (
        "playbooks check {tmp}/books",
        {"books/straggler.yaml": STRAGGLER_BOOK.replace("payload.slowdown", "payload.slowdwn")},
        "payload.slowdwn is not a field",
    ),
    "a goodput target as a percentage": ("goodput --target 97", {}, "0.97"),
    "a scores file that is not one": (
        "coordinator --listen 127.0.0.1:0 --state-dir {tmp}/st --config {tmp}/c.yaml",
        {"c.yaml": "coordinator: {precision_file: /dev/null}\n"},
        "/dev/null:1:1: not valid JSON",
    ),
    "a stream file that is not a mapping": (
        "rules score --corpus {tmp}/corpus",
        {"corpus/a.yaml": "- t: 1\n"},
        "a stream is a mapping",
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_what_an_operator_gets_wrong_is_refused_with_the_reason(
    name: str,
    tmp_path: Path,
    busy: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv, files, words = WRONG[name]
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    line = one_line_and_exit_2(
        [a.format(tmp=tmp_path, busy=busy) for a in argv.split()], capsys, monkeypatch
    )
    assert words in line, line


def test_a_key_twice_is_refused_where_yaml_would_keep_the_last() -> None:
    from sentinel.exitcodes import InputError
    from sentinel.inputs import parse_yaml

    assert parse_yaml("base: &b {x: 1}\nd: {<<: *b, x: 2}\n", "f") == {
        "base": {"x": 1},
        "d": {"x": 2},  # a merge's key overridden is YAML, not a repeat
    }
    with pytest.raises(InputError, match=r"f:3:1: duplicate key 'a' \(first at line 1\)"):
        parse_yaml("a: 1\nb: 2\na: 3\n", "f")
