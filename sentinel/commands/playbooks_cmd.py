"""`sentinel playbooks check DIR`: validate playbooks; every error with file, line and field."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sentinel.commands.jsonout import add_json_option, emit_json, json_to_stdout
from sentinel.exitcodes import ExitCode


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("playbooks", help="playbook tools")
    psub = p.add_subparsers(dest="playbooks_command", metavar="ACTION", required=True)
    check = psub.add_parser("check", help="validate every playbook in DIR; exit 2 on errors")
    check.add_argument("dir", type=Path, help="directory of playbook YAML files")
    check.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the coordinator's config (its validation baseline, for steps that validate)",
    )
    add_json_option(check, "the parsed playbooks")
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> int:
    from sentinel.config import load_config
    from sentinel.coordinator.core.playbooks import PlaybookError, load_playbooks

    baseline = load_config(args.config).coordinator.validation.baseline
    try:
        books = load_playbooks(args.dir, baseline)
    except PlaybookError as e:
        print(f"{args.dir}: {len(e.errors)} error(s)", file=sys.stderr)
        for line in e.errors:
            print(f"  {line}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    emit_json(args, [b.model_dump(mode="json") for b in books])
    if not json_to_stdout(args):
        for b in books:
            print(f"{b.name}: ok ({len(b.steps)} steps, priority {b.priority})")
    return ExitCode.OK
