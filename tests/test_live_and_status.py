"""What a person watches: the live progress display (burn-in, the demo, the benchmarks) under a
real pseudo-terminal and in plain lines through a pipe, and `sentinel status` against a real
coordinator, as JSON and as one screen in a real tmux terminal."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from coord_util import Coordinator, job_status, xid
from system_deps import require_command
from terminal import ANSI, run_in_pty

from sentinel.commands.demo_cmd import DemoDisplay
from sentinel.live import LiveProgress
from sentinel.protocol import (
    AgentFingerprintEvent,
    AgentFingerprintPayload,
    EventBatch,
    Source,
    encode,
)

ROOT = Path(__file__).resolve().parent.parent
SENTINEL = [sys.executable, "-m", "sentinel"]


def test_live_progress_draws_a_bar_on_a_terminal_and_lines_elsewhere() -> None:
    screen = io.StringIO()
    with LiveProgress("demo", screen, terminal=True) as live:
        live.phase("training", 10)
        for step in range(1, 11):
            live.advance(to=step)
        live.event("?? incident 3 opened: ecc_dbe on node-2")
        live.finish("10 steps")
    drawn = screen.getvalue()
    assert ANSI.search(drawn) and "10/10" in drawn and "eta" in drawn
    assert "demo ?? incident 3 opened: ecc_dbe on node-2" in ANSI.sub("", drawn)
    plain = io.StringIO()
    with LiveProgress("demo", plain, terminal=False) as live:
        live.phase("training", 8)
        for _ in range(8):
            live.advance("x")
        live.event("-> action evict_node done")
        live.finish()
    lines = plain.getvalue().splitlines()
    assert not ANSI.search(plain.getvalue())
    assert (
        lines[0] == "demo training: started, 8 steps" and "demo -> action evict_node done" in lines
    )
    assert lines[-1].startswith("demo training: done in") and len(lines) <= 8


def test_demo_display_follows_steps_rollbacks_and_incidents() -> None:
    screen = io.StringIO()
    with LiveProgress("demo", screen, terminal=True) as live:
        shown = DemoDisplay(live)
        for step in (1, 2, 3, 4):
            shown.step(step, 6)
        shown.echo("[   9.0s] ?? incident 1 opened: crash on rank-1")
        shown.step(3, 6)  # resumed from the checkpoint before the crash
        for step in (4, 5, 6):
            shown.step(step, 6)
    text = ANSI.sub("", screen.getvalue())
    assert "training" in text and "6/6" in text and "replaying after a rollback" in text
    assert "incident 1 opened: crash on rank-1" in text


@pytest.mark.slow
def test_burnin_progress_under_a_pseudo_terminal_and_through_a_pipe() -> None:
    argv = [*SENTINEL, "burnin", "--sim-nodes", "2", "--gpus-per-node", "1", "--quick"]
    argv += ["--phases", "collectives", "-b", "4K", "-e", "16K"]
    code, drawn = run_in_pty(argv)
    assert code == 0, drawn[-2000:]
    assert ANSI.search(drawn) and "burnin collectives" in drawn and "eta" in drawn
    assert "burnin collectives: done in" in ANSI.sub("", drawn)
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert piped.returncode == 0 and not ANSI.search(piped.stderr)
    assert "burnin collectives: started," in piped.stderr
    assert "burnin collectives: done in" in piped.stderr


def test_benchmarks_show_their_progress_under_a_pseudo_terminal() -> None:
    code, drawn = run_in_pty([sys.executable, "-m", "benchmarks", "goodput"], timeout_s=120)
    assert code == 0, drawn[-2000:]
    text = ANSI.sub("", drawn)
    assert ANSI.search(drawn) and "bench benchmarks" in text and "1/1" in text
    assert "goodput: {" in text  # the benchmark's JSON line, printed above the bar


# --- sentinel status ---------------------------------------------------------------------------


DOMAIN_A = "3c5b9a01-77e2-4f0d-a8c1-5d2e6f7a8b9c/7"  # an NVL72's fabric cluster and clique
DOMAIN_B = "3c5b9a01-77e2-4f0d-a8c1-5d2e6f7a8b9c/8"


@pytest.fixture
def busy(coord: Coordinator, tmp_path: Path) -> tuple[Coordinator, Path]:
    """A coordinator with a job and an open incident (a fatal XID on node-1)."""
    job = coord.token("--role", "job", "--job", "job1")
    node = coord.token("--role", "node", "--node", "node-1")
    status = job_status("job1", ["node-0", "node-1"], ["spare-0"])
    coord.call("POST", "/v1/events", job, encode(EventBatch(events=[status])).encode())
    coord.call(
        "POST", "/v1/events", node, encode(EventBatch(events=[xid("node-1", 0, 79)])).encode()
    )
    # every node's configuration fingerprint, spare-0's VBIOS older than the others', and in
    # another NVLink domain (its identity, not drift)
    admin = coord.token("--role", "admin")
    prints = [
        AgentFingerprintEvent(
            source=Source(node=n),
            ts=1.0,
            payload=AgentFingerprintPayload(
                fields={"driver": "570.124.06", "gpu.0.vbios": vbios, "nvlink_domain": domain}
            ),
        )
        for n, vbios, domain in (
            ("node-0", "96.00.A5", DOMAIN_A),
            ("node-1", "96.00.A5", DOMAIN_A),
            ("spare-0", "96.00.61", DOMAIN_B),
        )
    ]
    coord.call("POST", "/v1/events", admin, encode(EventBatch(events=prints)).encode())
    token = tmp_path / "operator.token"
    token.write_text(coord.token("--role", "operator") + "\n")
    return coord, token


def status(coord: Coordinator, token: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*SENTINEL, "status", "--coordinator", coord.url, "--token-file", str(token), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_status_as_json(busy: tuple[Coordinator, Path]) -> None:
    coord, token = busy
    deadline = time.monotonic() + 30
    while True:
        r = status(coord, token, "--json")
        doc = json.loads(r.stdout)
        if (doc["incidents"] and doc["incidents"][0]["runs"]) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.returncode == 1  # incidents are open
    assert doc["coordinator"] == coord.url and doc["fleet"]["nodes"] >= 1
    assert [j["id"] for j in doc["jobs"]] == ["job1"]
    assert doc["jobs"][0]["nodes"] == ["node-0", "node-1"]
    (inc,) = doc["incidents"]
    assert inc["target"] == "node-1" and inc["runs"][0]["playbook"] == inc["playbook"]
    assert inc["runs"][0]["steps"], inc
    assert doc["drift"] == {"nodes": 3, "drifted": {"spare-0": ["gpu.0.vbios"]}}
    assert doc["fleet"]["nvlink_domains"] == {DOMAIN_A: 2, DOMAIN_B: 1}


def test_status_refuses_a_bad_token_and_an_absent_coordinator(
    busy: tuple[Coordinator, Path], tmp_path: Path
) -> None:
    coord, _ = busy
    bad = tmp_path / "bad.token"
    bad.write_text("snt_nope_nope\n")
    r = status(coord, bad)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "401" in r.stderr
    r = subprocess.run(
        [*SENTINEL, "status", "--coordinator", "http://127.0.0.1:9", "--token-file", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # unreachable is its own answer (3), not "incidents are open" (1)
    assert r.returncode == 3 and "cannot reach the coordinator at http://127.0.0.1:9" in r.stderr


def test_status_is_one_screen_in_a_terminal(busy: tuple[Coordinator, Path]) -> None:
    tmux = require_command("tmux", "tmux")
    coord, token = busy
    session = f"sentinel-status-{uuid.uuid4().hex[:8]}"
    cmd = " ".join([*SENTINEL, "status", "--coordinator", coord.url, "--token-file", str(token)])
    shell = f"{cmd}; echo EXIT=$?; sleep 120"  # the pane stays to be read
    new = [tmux, "new-session", "-d", "-s", session, "-x", "120", "-y", "40", shell]
    subprocess.run(new, check=True)
    try:
        deadline, screen = time.monotonic() + 60, ""
        while "EXIT=" not in screen and time.monotonic() < deadline:
            time.sleep(0.5)
            screen = subprocess.run(
                [tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], check=False)
    assert "EXIT=1" in screen, screen
    assert f"Sentinel coordinator {coord.url}" in screen and "open incidents: 1" in screen
    assert "job1" in screen and "gpu_hardware" in screen and "evict_node:done" in screen
    assert "node-1 │ evicted" in screen
    assert "configuration drift: spare-0 (gpu.0.vbios)" in screen
    assert "NVLink domains: 2 (nodes in each: 3c5b9a01/7: 2, 3c5b9a01/8: 1)" in screen
    assert len(screen.rstrip().splitlines()) < 40  # all of it on one 120x40 screen


def operator_cli(
    coord: Coordinator, token: Path, command: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """`sentinel COMMAND ARGS` against `coord` with the operator's token file."""
    argv = [*SENTINEL, command, *args, "--coordinator", coord.url, "--token-file", str(token)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def incident(coord: Coordinator, token: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return operator_cli(coord, token, "incident", *args)


def test_an_operator_acts_on_an_incident_from_the_command_line(
    busy: tuple[Coordinator, Path],
) -> None:
    """`sentinel incident`: the API's operator verbs and hand-run actions, audited under the
    token's name; a refusal is one line and exit 2, whatever the coordinator refused."""
    coord, token = busy
    (open_,) = json.loads(status(coord, token, "--json").stdout)["incidents"]
    iid = str(open_["id"])
    r = incident(coord, token, "ack", iid, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["acknowledged_by"].startswith("operator:")
    r = incident(coord, token, "act", iid, "notify", "--param", "severity=info", "--why", "told")
    assert r.returncode == 0 and "act: run" in r.stdout, r.stdout + r.stderr
    for wrong, said in (
        (["act", iid, "notify", "--param", "severity=loud", "--why", "x"], "severity"),
        (["act", iid, "no_such_action", "--why", "x"], "unknown action"),
        (["ack", "9999"], "404"),
    ):
        r = incident(coord, token, *wrong)
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert incident(coord, token, "resolve", iid).returncode == 0
    r = incident(coord, token, "resolve", iid)  # twice: refused, not a silent no-op
    assert r.returncode == 2 and "409" in r.stderr
    admin = coord.token("--role", "admin")
    audit = coord.call("GET", "/v1/audit?limit=1000", admin)
    done = {a["what"] for a in audit if str(a["who"]).startswith("operator:")}  # type: ignore[union-attr]
    assert {"incident.acknowledge", "manual.notify", "incident.resolve"} <= done, done


def playbooks(coord: Coordinator, token: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return operator_cli(coord, token, "playbooks", *args)


def test_an_operator_switches_a_playbook_between_shadow_and_acting(
    busy: tuple[Coordinator, Path],
) -> None:
    """`sentinel playbooks list|shadow|act`: a playbook switched to shadow opens dry runs (they
    decide and record, act on nothing) until it is switched back; each switch is audited. The
    mode is kept in the store, which every replica of the coordinator reads."""
    coord, token = busy
    modes = {
        p["playbook"]: p
        for p in json.loads(playbooks(coord, token, "list", "--json").stdout)["playbooks"]
    }
    assert modes["gpu_hardware_fault"] == {
        "playbook": "gpu_hardware_fault",
        "mode": "acting",
        "set_by": "the default",
    }
    r = playbooks(coord, token, "shadow", "gpu_hardware_fault")
    assert r.returncode == 0 and r.stdout == "playbook gpu_hardware_fault: acting -> shadow\n"
    node = coord.token("--role", "node", "--node", "node-0")
    coord.call(
        "POST", "/v1/events", node, encode(EventBatch(events=[xid("node-0", 0, 79)])).encode()
    )
    admin = coord.token("--role", "admin")
    shadow = [i for i in coord.call("GET", "/v1/incidents", admin) if i["target"] == "node-0"]  # type: ignore[union-attr]
    (run,) = coord.call("GET", f"/v1/incidents/{shadow[0]['id']}", admin)["runs"]  # type: ignore[index]
    assert run["playbook"] == "gpu_hardware_fault" and run["dry_run"] is True, run
    r = playbooks(coord, token, "act", "gpu_hardware_fault", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {
        "playbook": "gpu_hardware_fault",
        "mode": "acting",
        "was": "shadow",
    }
    r = playbooks(coord, token, "shadow", "no_such_playbook")
    assert r.returncode == 2 and "no playbook 'no_such_playbook'" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    audit = coord.call("GET", "/v1/audit?limit=1000", admin)
    switched = [a["why"] for a in audit if a["what"] == "playbook.mode"]  # type: ignore[union-attr,index]
    assert switched == [  # newest first
        "gpu_hardware_fault: shadow -> acting",
        "gpu_hardware_fault: acting -> shadow",
    ]
