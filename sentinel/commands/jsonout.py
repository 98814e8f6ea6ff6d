"""One `--json` convention for every command: `--json` prints the command's result as JSON on
stdout (and nothing else there); `--json FILE` writes it to FILE and keeps stdout for a person.
`--json -` is stdout too. Both forms of the older options (`--json` alone, `--json FILE`) keep
working."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sentinel.exitcodes import InputError

STDOUT = "-"


def add_json_option(parser: argparse.ArgumentParser | Any, what: str) -> None:
    parser.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        metavar="FILE",
        help=f"{what} as JSON: on stdout (alone there), or written to FILE",
    )


def json_to_stdout(args: argparse.Namespace) -> bool:
    return getattr(args, "json", None) == STDOUT


def check_json_target(args: argparse.Namespace) -> None:
    """Refuse a FILE whose directory does not exist before any work starts."""
    target = getattr(args, "json", None)
    if target not in (None, STDOUT) and not Path(target).resolve().parent.is_dir():
        raise InputError(f"--json {target}: directory does not exist: {Path(target).parent}")


def emit_json(args: argparse.Namespace, doc: Any) -> None:
    """Write `doc` where `--json` says; nothing when it was not given."""
    target = getattr(args, "json", None)
    if target is None:
        return
    text = json.dumps(doc, indent=2) + "\n"
    if target == STDOUT:
        print(text, end="", flush=True)
    else:
        Path(target).write_text(text)
