"""Conventions every command keeps: help text on every option, one `--json` convention, and
`--log-format`/`--log-level` accepted before or after the subcommand."""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

from sentinel.cli import build_parser


def parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def test_every_option_and_argument_has_help() -> None:
    missing = [
        f"sentinel {' '.join(path)} {action.option_strings or action.dest}"
        for path, p in parsers(build_parser())
        for action in p._actions
        if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction)
        and not action.help
    ]
    assert missing == []


def test_json_is_one_option_everywhere() -> None:
    """`--json` alone prints to stdout; `--json FILE` writes FILE (the same option on every
    command that has one)."""
    seen = 0
    for path, p in parsers(build_parser()):
        for action in p._actions:
            if "--json" in action.option_strings:
                seen += 1
                assert (action.nargs, action.const, action.metavar) == ("?", "-", "FILE"), path
    assert seen >= 9


def test_json_to_stdout_or_to_a_file(sentinel_cmd: list[str], tmp_path: Path) -> None:
    pb = Path(__file__).resolve().parent.parent / "playbooks"
    r = subprocess.run(
        [*sentinel_cmd, "playbooks", "check", str(pb), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    books = json.loads(r.stdout)
    out = tmp_path / "books.json"
    r = subprocess.run(
        [*sentinel_cmd, "playbooks", "check", str(pb), "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and json.loads(out.read_text()) == books
    assert "ok (" in r.stdout  # stdout stays for a person


def test_log_options_after_the_subcommand(sentinel_cmd: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    for argv in (
        ["--log-format", "json", "token", "list", "--state-dir", str(missing)],
        ["token", "list", "--state-dir", str(missing), "--log-format", "json"],
    ):
        r = subprocess.run([*sentinel_cmd, *argv], capture_output=True, text=True)
        assert r.returncode == 2 and "no coordinator token store" in r.stderr, r.stderr


def test_token_list_never_creates_a_store(sentinel_cmd: list[str], tmp_path: Path) -> None:
    env_free = tmp_path / "nowhere"
    r = subprocess.run(
        [*sentinel_cmd, "token", "list", "--state-dir", str(env_free)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert not env_free.exists()
