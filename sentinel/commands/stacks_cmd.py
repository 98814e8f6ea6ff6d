"""`sentinel stacks JOB [--json]`: every rank's Python stacks, grouped, odd ones out first."""

from __future__ import annotations

import argparse
import re

from sentinel.commands.jsonout import add_json_option, check_json_target, emit_json, json_to_stdout
from sentinel.commands.status_cmd import add_coordinator_options, ask
from sentinel.exitcodes import ExitCode, InputError

_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stacks",
        help="every rank's Python stacks (all threads), grouped: the odd ones out first",
        description="Asks the coordinator (operator or admin token) to collect every rank's "
        "Python stacks through the node agents, waits until all ranks answered or --wait "
        "passed, and prints identical stacks once with the ranks sharing them (`ranks 0-5,7`), "
        "the smallest groups first, and the ranks that did not answer. Exit 0 when every rank "
        "answered, 1 when some did not, 2 on bad input (an unknown job, a refused token), 3 when "
        "no coordinator answered.",
    )
    p.add_argument("job", metavar="JOB", help="the job id (as `sentinel run --job-id` named it)")
    p.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the ranks' answers (default 10)",
    )
    add_coordinator_options(p)
    add_json_option(p, "the grouped stacks")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sentinel.stacks.client import collect
    from sentinel.stacks.render import render

    if not _JOB.fullmatch(args.job):
        raise InputError(f"JOB {args.job[:40]!r}: letters, digits and ._@:- only")
    if not 0 < args.wait <= 600:
        raise InputError(f"--wait {args.wait}: between 0 and 600 seconds")
    check_json_target(args)
    doc = ask(args, lambda client: collect(client, args.job, args.wait))
    if doc is None:
        return ExitCode.UNAVAILABLE
    emit_json(args, doc)
    if not json_to_stdout(args):
        print(render(doc), end="")
    return ExitCode.PROBLEM_FOUND if doc["missing_ranks"] else ExitCode.OK
