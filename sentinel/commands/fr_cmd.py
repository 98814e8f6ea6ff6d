"""`sentinel fr analyze DIR [--json]`: which rank is stuck, and in what collective."""

from __future__ import annotations

import argparse
from typing import Any

from sentinel.commands.jsonout import add_json_option, emit_json, json_to_stdout
from sentinel.exitcodes import ExitCode, InputError


def register(sub: argparse._SubParsersAction) -> None:
    fr = sub.add_parser("fr", help="flight-recorder tools")
    fr_sub = fr.add_subparsers(dest="fr_command", metavar="ACTION", required=True)
    analyze = fr_sub.add_parser(
        "analyze",
        help="match collectives across rank dumps; name the culprit (exit 1 if one is found)",
    )
    analyze.add_argument("dump_dir", help="directory with one dump per rank (<prefix><rank>)")
    add_json_option(analyze, "the analysis")
    analyze.add_argument("--prefix", help="dump file name prefix (default: inferred)")
    analyze.add_argument("--workers", type=int, help="processes reading dumps (default: CPUs)")
    analyze.set_defaults(handler=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    from sentinel.fr import DumpError, analyze, load_dir

    try:
        dumps = load_dir(args.dump_dir, prefix=args.prefix, workers=args.workers)
    except DumpError as e:
        raise InputError(f"{args.dump_dir}: {e}") from None
    if not dumps.summaries and not dumps.sidecars:
        # Nothing here is a dump: bad input, not a verdict about the job's ranks.
        why = "; ".join(f"{dumps.prefix}{r}: {e}" for r, e in sorted(dumps.unreadable.items())[:3])
        raise InputError(f"{args.dump_dir}: no readable flight-recorder dump ({why})")
    report = analyze(dumps)
    emit_json(args, report.to_json())
    if not json_to_stdout(args):
        print(render(report.to_json()))
    return ExitCode.OK if report.verdict == "ok" else ExitCode.PROBLEM_FOUND


def render(r: dict[str, Any]) -> str:
    lines = [f"verdict:        {r['verdict']}  ({r['ranks_analyzed']} dumps)"]
    if r.get("evidence") == "missing_dump":
        lines.append("evidence:       the missing dumps (no recorded collective names the culprit)")
    lines.append(f"culprit ranks:  {_ranks(r['culprit_ranks'])}")
    lines.append(f"waiting ranks:  {_ranks(r['waiting_ranks'])}")
    c = r.get("collective")
    if c:
        lines.append(f"collective:     group {c['pg']} ({c['pg_desc']}) seq {c['seq']} {c['op']}")
    lines.append(f"why:            {r['reason']}")
    if r["missing_ranks"]:
        lines.append(f"missing dumps:  {_ranks(r['missing_ranks'])}")
    for rank, err in r["unreadable"].items():
        lines.append(f"unreadable:     rank {rank}: {err}")
    if r["wrapped_ranks"]:
        lines.append(
            f"ring wrapped:   {len(r['wrapped_ranks'])} ranks overwrote older entries "
            "(sequence numbers from pg_status are still exact)"
        )
    for s in r["stuck_groups"][:10]:
        lines.append(
            f"  group {s['pg']} ({s['pg_desc']}): seq {s['seq']} {s['op']}: "
            f"{len(s['waiting'])} waiting on {_ranks(s['behind'])}"
        )
    return "\n".join(lines)


def _ranks(ranks: list[int], limit: int = 32) -> str:
    shown = ", ".join(map(str, ranks[:limit]))
    more = f", ... ({len(ranks)} in all)" if len(ranks) > limit else ""
    return f"[{shown}{more}]"
