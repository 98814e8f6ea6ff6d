"""`sentinel playbooks check DIR`: validate playbooks; every error with file, line and field."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sentinel.exitcodes import ExitCode


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("playbooks", help="playbook tools")
    psub = p.add_subparsers(dest="playbooks_command", metavar="ACTION", required=True)
    check = psub.add_parser("check", help="validate every playbook in DIR; exit 2 on errors")
    check.add_argument("dir", type=Path)
    check.add_argument("--json", action="store_true", help="print the parsed playbooks")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    from sentinel.coordinator.playbooks import PlaybookError, load_playbooks

    try:
        books = load_playbooks(args.dir)
    except PlaybookError as e:
        print(f"{args.dir}: {len(e.errors)} error(s)", file=sys.stderr)
        for line in e.errors:
            print(f"  {line}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.json:
        print(json.dumps([b.model_dump(mode="json") for b in books], indent=2))
    else:
        for b in books:
            print(f"{b.name}: ok ({len(b.steps)} steps, priority {b.priority})")
    return ExitCode.OK
