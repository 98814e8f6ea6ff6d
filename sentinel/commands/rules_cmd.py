"""`sentinel rules score [--corpus DIR] [--playbooks DIR] [--json [FILE]]`: replay the labelled
corpus through the real agent rules and coordinator, and print each playbook's and each rule's
precision, recall, detection latency and actions (`sentinel.precision`). Exit 0 when no benign
stream saw a destructive action and the faults' recall is at its bar, 1 otherwise, 2 on a bad
corpus or playbook."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from sentinel.commands.jsonout import add_json_option, check_json_target, emit_json, json_to_stdout
from sentinel.exitcodes import ExitCode, InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rules", help="the health rules' and playbooks' measured precision")
    psub = p.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    s = psub.add_parser(
        "score",
        help="replay the labelled corpus; per playbook and rule: precision, recall, latency",
    )
    s.add_argument("--corpus", type=Path, metavar="DIR", help="stream files (default: shipped)")
    s.add_argument(
        "--playbooks", type=Path, metavar="DIR", help="playbooks to score (default: shipped)"
    )
    add_json_option(s, "the scores")
    s.set_defaults(handler=run_score)


def run_score(args: argparse.Namespace) -> int:
    from sentinel.coordinator.core.playbooks import (
        PlaybookError,
        default_playbooks_dir,
        load_playbooks,
    )
    from sentinel.precision.corpus import CORPUS_DIR, load_corpus
    from sentinel.precision.replay import replay_corpus
    from sentinel.precision.score import score

    check_json_target(args)
    streams = load_corpus(args.corpus or CORPUS_DIR)
    where = args.playbooks or default_playbooks_dir()
    try:
        books = load_playbooks(where)
    except PlaybookError as e:
        raise InputError(f"{where}: " + "; ".join(e.errors)) from None
    with tempfile.TemporaryDirectory(prefix="sentinel-rules-") as tmp:
        replays = replay_corpus(streams, books, Path(tmp))
    result = score(replays, books)
    emit_json(args, result.doc())
    if not json_to_stdout(args):
        print(render(result.doc()))
    return ExitCode.OK if result.held else ExitCode.PROBLEM_FOUND


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['streams']} streams ({doc['benign']} benign, {doc['faults']} fault); "
        f"recall {_pct(doc['recall'])} (bar {doc['bars']['recall']}); "
        f"destructive actions on benign streams: {len(doc['destructive_on_benign'])}",
    ]
    for d in doc["destructive_on_benign"]:
        lines.append(
            f"  {d['stream']}: {d['playbook']} on {d['target']}: {', '.join(d['actions'])}"
        )
    for what in ("playbooks", "rules"):
        lines.append(f"{what}: name  true false missed  precision recall  latency  [false in]")
        for name, t in doc[what].items():
            lat = t["latency_s"]
            span = "-" if lat is None else f"{lat['min']:g}-{lat['max']:g} s"
            false_in = f"  [{', '.join(t['false_in'])}]" if t["false_in"] else ""
            lines.append(
                f"  {name}  {t['true']} {t['false']} {t['missed']}  "
                f"{_pct(t['precision'])} {_pct(t['recall'])}  {span}{false_in}"
            )
    return "\n".join(lines)
