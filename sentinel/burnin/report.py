"""The burn-in report: per-node verdicts, the JSON contract, a summary table, the exclude list
and baseline files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentinel.exitcodes import InputError
from sentinel.inputs import read_json

BASELINE_VERSION = 1


@dataclass
class Findings:
    """What the phases concluded, before it becomes the report."""

    node_of: list[str]
    node_reasons: dict[str, list[str]] = field(default_factory=dict)
    fleet_reasons: list[str] = field(default_factory=list)

    def blame_node(self, node: str, reason: str) -> None:
        self.node_reasons.setdefault(node, []).append(reason)

    def blame_rank(self, rank: int, reason: str) -> None:
        node = self.node_of[rank]
        local = [r for r, n in enumerate(self.node_of) if n == node].index(rank)
        self.blame_node(node, f"rank {rank} (local {local}): {reason}")


def assemble(findings: Findings, sections: dict[str, Any]) -> dict[str, Any]:
    nodes = list(dict.fromkeys(findings.node_of))
    node_rows = {
        n: {
            "verdict": "fail" if findings.node_reasons.get(n) else "pass",
            "reasons": findings.node_reasons.get(n, []),
            "ranks": [r for r, m in enumerate(findings.node_of) if m == n],
        }
        for n in nodes
    }
    exclude = [n for n in nodes if node_rows[n]["verdict"] == "fail"]
    report: dict[str, Any] = {
        "verdict": "fail" if exclude or findings.fleet_reasons else "pass",
        "nodes": node_rows,
        "collectives": [],
        "links": [],
        "stragglers": [],
        "sdc": {"mismatched_ranks": []},
        "exclude": exclude,
        "fleet_reasons": findings.fleet_reasons,
        "world_size": len(findings.node_of),
    }
    report.update(sections)
    return report


def _fmt_bytes(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"


def render(report: dict[str, Any]) -> str:
    """The human summary: a node table, the collective sweep and the link findings."""
    lines = [
        f"burn-in: {report['verdict'].upper()}  ({report['world_size']} ranks, "
        f"{len(report['nodes'])} nodes, phases {', '.join(report.get('phases', []))})",
        "",
    ]
    lines.append(f"{'node':<12} {'verdict':<8} reasons")
    for node, row in report["nodes"].items():
        reasons = row["reasons"] or ["-"]
        lines.append(f"{node:<12} {row['verdict']:<8} {reasons[0]}")
        lines.extend(f"{'':<21} {r}" for r in reasons[1:])
    if report["collectives"]:
        lines += ["", f"{'op':<15} {'bytes':>7} {'algbw GB/s':>11} {'busbw GB/s':>11} correct"]
        for c in report["collectives"]:
            lines.append(
                f"{c['op']:<15} {_fmt_bytes(c['bytes']):>7} {c['algbw_gbps']:>11.3f} "
                f"{c['busbw_gbps']:>11.3f} {'yes' if c['correct'] else 'NO'}"
            )
    search = report.get("link_search")
    if search:
        lines += [
            "",
            f"links: fleet median {search.get('reference_gbps', 0):.3f} GB/s; "
            + "; ".join(
                f"{k} {v['rounds']} rounds"
                for k, v in search.items()
                if k in ("circle", "bisection")
            ),
        ]
        lines += [
            f"  {x['a']} <-> {x['b']}: {x['gbps']:.3f} GB/s"
            for x in report["links"]
            if x["verdict"] == "fail"
        ]
        bis = search.get("bisection")
        if bis:
            lines.append(f"  bisection: {bis['found'] or bis['note']}")
    if report["stragglers"]:
        lines.append(f"\nstragglers: ranks {report['stragglers']}")
    if report["sdc"]["mismatched_ranks"]:
        lines.append(f"SDC: mismatched ranks {report['sdc']['mismatched_ranks']}")
    lines += [f"fleet: {r}" for r in report["fleet_reasons"]]
    lines.append(f"\nexclude: {' '.join(report['exclude']) or '(none)'}")
    return "\n".join(lines)


def write_exclude(path: Path, nodes: Sequence[str]) -> None:
    """One node name per line: what `srun --exclude`, the supervisor and the coordinator read."""
    path.write_text("".join(f"{n}\n" for n in nodes))


# --- baselines ---------------------------------------------------------------------------


def baseline_from(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": BASELINE_VERSION,
        "world_size": report["world_size"],
        "busbw_gbps": {f"{c['op']}:{c['bytes']}": c["busbw_gbps"] for c in report["collectives"]},
        "node_link_gbps": report.get("link_search", {}).get("node_scores", {}),
        "gemm_s": report.get("straggler_detail", {}).get("median_gemm_s"),
    }


def load_baseline(path: Path) -> dict[str, Any]:
    doc = read_json(path, "--baseline: a burn-in baseline")
    if not isinstance(doc, dict) or doc.get("version") != BASELINE_VERSION:
        raise InputError(
            f"--baseline {path}: not a burn-in baseline (version {BASELINE_VERSION}); "
            "make one with --save-baseline on a healthy fleet"
        )
    for key, kind in (("busbw_gbps", dict), ("node_link_gbps", dict), ("world_size", int)):
        if not isinstance(doc.get(key), kind):
            raise InputError(f"--baseline {path}: field {key!r} missing or not a {kind.__name__}")
    return doc
