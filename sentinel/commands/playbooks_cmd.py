"""`sentinel playbooks check DIR`: validate playbooks; every error with file, line and field; and
whether each may act or runs in shadow by the rules corpus's measurement (`precision/gate.py`).
`sentinel playbooks list|shadow NAME|act NAME`: read and switch, through the coordinator's API,
whether each playbook acts or only records what it would have done (a shadow, or dry, run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import quote

from sentinel.commands.incident_cmd import REFUSED
from sentinel.commands.jsonout import add_json_option, check_json_target, emit_json, json_to_stdout
from sentinel.commands.status_cmd import add_coordinator_options, ask
from sentinel.exitcodes import ExitCode

# the playbook's mode its runs take from now on, by the verb that sets it
MODES = {"shadow": "shadow", "act": "acting"}


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
    listing = psub.add_parser(
        "list",
        help="every playbook the coordinator runs: shadow or acting, and what set it",
    )
    add_coordinator_options(listing)
    add_json_option(listing, "the coordinator's answer")
    listing.set_defaults(handler=run_list)
    for verb, mode in MODES.items():
        what = (
            "record what it would do and do none of it (dry runs)"
            if mode == "shadow"
            else "carry its steps out"
        )
        v = psub.add_parser(
            verb,
            help=f"switch a playbook to {mode}: its next runs {what}",
            description=f"Switch playbook NAME to {mode}: the runs it opens from now on {what}; "
            "a run under way keeps its mode. Overrides the playbook's guards.dry_run and the "
            "coordinator's dry_run; audited under the token's name (operator or admin). Exit 0 "
            "when the coordinator took it, 2 when it refused it (no such playbook, the token's "
            "role), 3 when no coordinator answered.",
        )
        v.add_argument("name", metavar="NAME", help="the playbook's name, as `list` shows it")
        add_coordinator_options(v)
        add_json_option(v, "the coordinator's answer")
        v.set_defaults(handler=run_switch, mode=mode)


def run_check(args: argparse.Namespace) -> int:
    from sentinel.config import load_config
    from sentinel.coordinator.core.playbooks import PlaybookError, load_playbooks
    from sentinel.precision.gate import gate

    coordinator = load_config(args.config).coordinator
    try:
        books = load_playbooks(args.dir, coordinator.validation.baseline)
    except PlaybookError as e:
        print(f"{args.dir}: {len(e.errors)} error(s)", file=sys.stderr)
        for line in e.errors:
            print(f"  {line}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    gate(books, coordinator.precision_file)  # what the coordinator would let each one do
    docs = []
    for b in books:
        cleared = b.clearance
        assert cleared is not None
        docs.append(b.model_dump(mode="json") | {"acts": cleared.acts, "why": cleared.why})
    emit_json(args, docs)
    if not json_to_stdout(args):
        for b, doc in zip(books, docs, strict=True):
            mode = "acts" if doc["acts"] else "shadow"
            print(
                f"{b.name}: ok ({len(b.steps)} steps, priority {b.priority}); {mode}: {doc['why']}"
            )
    return ExitCode.OK


def run_list(args: argparse.Namespace) -> int:
    check_json_target(args)
    doc = ask(args, lambda c: c.call("GET", "/v1/playbooks", REFUSED))
    if doc is None:
        return ExitCode.UNAVAILABLE
    emit_json(args, doc)
    if not json_to_stdout(args):
        for p in doc["playbooks"]:
            print(f"{p['playbook']}: {p['mode']} ({p['set_by']})")
    return ExitCode.OK


def run_switch(args: argparse.Namespace) -> int:
    check_json_target(args)
    path, body = f"/v1/playbooks/{quote(args.name, safe='')}/mode", {"mode": args.mode}
    doc = ask(args, lambda c: c.call("PUT", path, REFUSED, body))
    if doc is None:
        return ExitCode.UNAVAILABLE
    emit_json(args, doc)
    if not json_to_stdout(args):
        print(f"playbook {doc['playbook']}: {doc['was']} -> {doc['mode']}")
    return ExitCode.OK
