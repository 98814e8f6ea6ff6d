"""`sentinel fleet drift`: the nodes whose configuration fingerprint differs from the fleet's
majority, and in which fields, as the coordinator judges them from its agents' reports
(`GET /v1/fleet/drift`; sentinel/fingerprint.py)."""

from __future__ import annotations

import argparse
import re
import urllib.parse
from typing import Any

from sentinel.commands.jsonout import add_json_option, check_json_target, emit_json, json_to_stdout
from sentinel.commands.status_cmd import add_coordinator_options, ask
from sentinel.config import DRIFT_PATTERN
from sentinel.exitcodes import ExitCode, InputError

REFUSED = (400, 401, 403, 422)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fleet", help="fleet-wide checks: configuration drift")
    checks = p.add_subparsers(dest="check", metavar="CHECK", required=True)
    d = checks.add_parser(
        "drift",
        help="name every node whose configuration differs from the fleet's majority",
        description="Every node whose configuration fingerprint (driver, CUDA, VBIOS, InfoROM, "
        "persistence and ECC modes, kernel, the job's Python, torch and NCCL, its NCCL_* and "
        "FI_* environment) differs from what most nodes report, and which fields differ. "
        "Exit 0 when no node drifted, 1 when one did, 2 for a bad request, 3 when no "
        "coordinator answered.",
    )
    d.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="FIELD",
        help="a field allowed to differ (repeatable; fnmatch patterns: 'gpu.*.inforom'), "
        "besides the coordinator's drift_allowed",
    )
    add_coordinator_options(d)
    add_json_option(d, "the coordinator's answer")
    d.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_json_target(args)
    for pattern in args.allow:
        if not re.match(DRIFT_PATTERN, pattern):
            raise InputError(f"--allow {pattern!r}: want a field name or an fnmatch pattern")
    path = "/v1/fleet/drift"
    if args.allow:
        path += "?" + urllib.parse.urlencode({"allow": ",".join(args.allow)})
    doc = ask(args, lambda c: c.call("GET", path, REFUSED))
    if doc is None:
        return ExitCode.UNAVAILABLE
    emit_json(args, doc)
    if not json_to_stdout(args):
        print(render(doc))
    return ExitCode.PROBLEM_FOUND if doc["drifted"] else ExitCode.OK


def render(doc: dict[str, Any]) -> str:
    head = f"{doc['nodes']} nodes reported a fingerprint; "
    allowed = f" (allowed to differ: {', '.join(doc['allowed'])})" if doc["allowed"] else ""
    if not doc["drifted"]:
        return head + "none differs from the fleet's majority" + allowed
    lines = [head + f"{len(doc['drifted'])} drifted{allowed}:"]
    for node in doc["drifted"]:
        lines.append(f"  {node['node']}")
        for d in node["differences"]:
            fleet = d["majority"] or "no majority"
            lines.append(f"    {d['field']}: {d['value']}  (fleet: {fleet})")
    return "\n".join(lines)
