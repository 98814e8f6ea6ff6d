"""What the report reads off the demo's data, in plain Python (no plotting): which steps were
rolled back, the slowest rank, the burn-in's measured links, the time account's categories."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sentinel.lab.demo.data import RankSample

# The time account's categories (account.py), in the order they are stacked.
GOODPUT_PARTS = (
    ("productive", "productive steps", "#009E73"),
    ("rollback", "lost to rollback", "#E69F00"),
    ("detection", "detection", "#CC79A7"),
    ("repair", "repair", "#D55E00"),
    ("checkpoint", "checkpoint stalls", "#56B4E9"),
    ("burnin", "burn-in", "#F0E442"),
    ("startup", "start-up", "#8c959f"),
)


def rolled_back_from(points: Iterable[tuple[int, int]]) -> dict[int, int]:
    """From (generation, step) pairs: per generation, the first of its steps that a later
    generation trained again (a generation absent from the answer lost nothing)."""
    starts: dict[int, int] = {}
    for gen, step in points:
        starts[gen] = min(starts.get(gen, step), step)
    out = {}
    for gen in starts:
        later = [s for g, s in starts.items() if g > gen]
        if later:
            out[gen] = min(later)
    return out


def natural_key(name: str) -> list[Any]:
    """Sort key putting node-2 before node-10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def straggler_note(samples: Sequence[RankSample]) -> str | None:
    """Which rank is slowest by median step time, and by how much, in plain words."""
    per: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        per[s.rank].append(s.step_s)
    if len(per) < 2:
        return None
    med = {r: sorted(v)[len(v) // 2] for r, v in per.items()}
    slow = max(med, key=lambda r: med[r])
    others = sorted(v for r, v in med.items() if r != slow)
    base = others[len(others) // 2]
    if base <= 0:
        return None
    return (
        f"Slowest rank by median step time: rank {slow} at {med[slow]:.3g} s, "
        f"{med[slow] / base:.2f}x the median of the other ranks ({base:.3g} s)."
    )


def measured_links(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The links with both ends and a numeric bandwidth (others cannot be placed on the matrix)."""
    return [
        link
        for link in report.get("links") or []
        if isinstance(link, dict)
        and link.get("a") is not None
        and link.get("b") is not None
        and isinstance(link.get("gbps"), int | float)
    ]


def burnin_nodes(report: dict[str, Any]) -> list[str]:
    names = set(report.get("nodes") or {})
    for link in measured_links(report):
        names.update((str(link["a"]), str(link["b"])))
    return sorted(names, key=natural_key)
