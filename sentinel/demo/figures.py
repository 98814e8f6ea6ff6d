"""Turns the demo's recorded data into the report's charts (pure data → SVG string)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sentinel.demo.data import RankSample, StepPoint, TimelineEntry
from sentinel.demo.svg import (
    PALETTE,
    Band,
    ColourScale,
    LaneEvent,
    Series,
    VMarker,
    heatmap,
    lane_chart,
    line_chart,
    nice_domain,
    stacked_bar,
)

FAULT_COLOUR = "#d1242f"
DETECT_COLOUR = "#8250df"
REFERENCE_COLOUR = "#8c959f"
MAX_COLUMNS = 200
LANES = (
    ("Faults", ("fault",), FAULT_COLOUR),
    ("Detection", ("detect", "incident"), DETECT_COLOUR),
    ("Actions", ("action",), "#0072B2"),
    ("Resume", ("resume",), "#009E73"),
    ("Burn-in", ("burnin",), "#E69F00"),
    ("Info", ("info",), "#57606a"),
)
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


def natural_key(name: str) -> list[Any]:
    """Sort key putting node-2 before node-10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def rolled_back_from(steps: Sequence[StepPoint]) -> dict[int, int]:
    """Per generation, the first step that a later generation replayed (absent: none was)."""
    starts: dict[int, int] = {}
    for p in steps:
        starts[p.generation] = min(starts.get(p.generation, p.step), p.step)
    out = {}
    for gen in starts:
        later = [s for g, s in starts.items() if g > gen]
        if later:
            out[gen] = min(later)
    return out


def loss_y_domain(losses: Sequence[float]) -> tuple[float, float]:
    """A y range for the losses; one wild spike is pinned at the top instead of flattening all."""
    finite = sorted(v for v in losses if math.isfinite(v))
    lo, hi = finite[0], finite[-1]
    q = finite[int(0.95 * (len(finite) - 1))]
    if q > lo and hi > q + 2 * (q - lo):
        return nice_domain(lo, q + 0.6 * (q - lo))
    return nice_domain(lo, hi)


def loss_chart(
    steps: Sequence[StepPoint], reference: Sequence[StepPoint], result: dict[str, Any]
) -> str:
    series: list[Series] = []
    if reference:
        pts = [(p.step, p.loss) for p in sorted(reference, key=lambda p: p.step)]
        series.append(Series("clean reference run", pts, REFERENCE_COLOUR, width=1.2))
    cut = rolled_back_from(steps)
    bands, replaced = [], []
    for i, gen in enumerate(sorted({p.generation for p in steps})):
        colour = PALETTE[i % len(PALETTE)]
        mine = sorted((p for p in steps if p.generation == gen), key=lambda p: p.step)
        kept = [(p.step, p.loss) for p in mine if p.step < cut.get(gen, math.inf)]
        lost = [(p.step, p.loss) for p in mine if p.step >= cut.get(gen, math.inf) - 1]
        if kept:
            series.append(Series(f"generation {gen}", kept, colour))
        if gen in cut and len(lost) > 1:
            name = f"generation {gen}, rolled back"
            replaced.append(Series(name, lost, colour, dash="5 4", opacity=0.8))
            bands.append(Band(cut[gen], mine[-1].step, "rolled back, then replayed"))
    losses = [p.loss for p in [*steps, *reference]]
    return line_chart(
        series + replaced,  # on top: replayed steps often retrace them exactly
        title="Training loss per step",
        x_label="step",
        y_label="loss",
        markers=incident_markers(result),
        bands=bands,
        y_domain=loss_y_domain(losses),
    )


def incident_markers(result: dict[str, Any]) -> list[VMarker]:
    out = []
    for f in result.get("faults") or []:
        if isinstance(f.get("injected_step"), int):
            detail = f"{f.get('kind')} on {f.get('target')} injected at step {f['injected_step']}"
            out.append(VMarker(f["injected_step"], f"✕ {f.get('kind')}", FAULT_COLOUR, "", detail))
    for inc in result.get("incidents") or []:
        if isinstance(inc.get("detected_step"), int):
            detail = f"incident {inc.get('id')}: {inc.get('kind')} on {inc.get('target')}"
            label = f"⚑ {inc.get('kind')}"
            out.append(VMarker(inc["detected_step"], label, DETECT_COLOUR, "4 3", detail))
    return out


def rank_matrix(
    samples: Sequence[RankSample], field: str
) -> tuple[list[int], list[int], list[list[float | None]]]:
    """Ranks x step columns of the last sample per (rank, step); over MAX_COLUMNS steps, columns
    are bins holding their worst (largest) value so a slow step still shows."""
    cells: dict[tuple[int, int], float] = {}
    for s in samples:
        v = s.step_s if field == "step_s" else s.mfu
        if v is not None:
            cells[(s.rank, s.step)] = v
    ranks = sorted({s.rank for s in samples})
    steps = sorted({s.step for s in samples})
    width = max(1, math.ceil(len(steps) / MAX_COLUMNS))
    bins = [steps[i : i + width] for i in range(0, len(steps), width)]
    pick = max if field == "step_s" else min
    matrix: list[list[float | None]] = []
    for r in ranks:
        row: list[float | None] = []
        for b in bins:
            vals = [cells[(r, s)] for s in b if (r, s) in cells]
            row.append(pick(vals) if vals else None)
        matrix.append(row)
    return ranks, [b[0] for b in bins], matrix


def rank_label(rank: int, nodes: dict[int, str]) -> str:
    return f"rank {rank} · {nodes[rank]}" if rank in nodes else f"rank {rank}"


def rank_heatmap(samples: Sequence[RankSample], nodes: dict[int, str], field: str) -> str:
    ranks, cols, matrix = rank_matrix(samples, field)
    scale = None
    unit = "s"
    if field == "mfu":
        flat = [v for row in matrix for v in row if v is not None]
        if flat and max(flat) <= 1.0:
            matrix = [[None if v is None else 100 * v for v in row] for row in matrix]
            unit = "% MFU"
        else:
            unit = "MFU"
        scale = ColourScale.for_values([v for row in matrix for v in row if v is not None])
        scale = ColourScale(scale.lo, scale.hi)
    title = "Step time per rank" if field == "step_s" else "Model FLOPs utilisation per rank"
    return heatmap(
        matrix,
        [rank_label(r, nodes) for r in ranks],
        [str(c) for c in cols],
        title=title,
        x_label="step",
        y_label="rank",
        unit=unit,
        scale=scale,
        cell_height=22,
    )


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


def burnin_heatmap(report: dict[str, Any]) -> str:
    nodes = burnin_nodes(report)
    index = {n: i for i, n in enumerate(nodes)}
    matrix: list[list[float | None]] = [[None] * len(nodes) for _ in nodes]
    flagged: set[tuple[int, int]] = set()
    for link in measured_links(report):
        a, b = index[str(link["a"])], index[str(link["b"])]
        gbps = float(link["gbps"])
        for i, j in {(a, b), (b, a)}:
            old = matrix[i][j]
            matrix[i][j] = gbps if old is None else min(old, gbps)
            if link.get("verdict", "pass") != "pass":
                flagged.add((i, j))
    return heatmap(
        matrix,
        nodes,
        nodes,
        title="Burn-in link bandwidth (GB/s)",
        x_label="node",
        y_label="node",
        unit="GB/s",
        outlined=frozenset(flagged),
        annotate=True,
        width=min(960, 260 + 90 * len(nodes)),
    )


def timeline_chart(entries: Sequence[TimelineEntry], result: dict[str, Any]) -> str:
    lanes = [(name, kinds, c) for name, kinds, c in LANES if any(e.kind in kinds for e in entries)]
    events = []
    for e in entries:
        name, _, colour = next(lane for lane in lanes if e.kind in lane[1])
        label = e.text if len(e.text) <= 26 else e.text[:25] + "…"
        where = f"step {e.step}, " if e.step is not None else ""
        who = f"{e.target}: " if e.target else ""
        detail = f"{who}{e.text} ({where}t={e.t:.1f} s)"
        events.append(LaneEvent(name, e.t, None, label, colour, detail))
    names = [name for name, _, _ in lanes]
    events += repair_spans(entries, result.get("faults") or [], names)
    return lane_chart(
        names,
        events,
        title="Faults, detection, repair and resume over time",
        x_label="seconds since the demo started",
    )


def repair_spans(
    entries: Sequence[TimelineEntry], faults: Sequence[dict[str, Any]], lanes: Sequence[str]
) -> list[LaneEvent]:
    """Bars for each fault's measured time to detect (from its injection entry) and time to
    resume (from detection), on the Detection and Resume lanes where those exist."""
    out = []
    for f in faults:
        start = next(
            (
                e.t
                for e in entries
                if e.kind == "fault"
                and e.target == f.get("target")
                and e.step in (None, f.get("injected_step"))
            ),
            None,
        )
        detect, resume = f.get("time_to_detect_s"), f.get("time_to_resume_s")
        if start is None or not isinstance(detect, int | float):
            continue
        what = f"{f.get('kind')} on {f.get('target')}"
        if "Detection" in lanes:
            label = f"{detect:.1f} s to detect"
            out.append(LaneEvent("Detection", start, start + detect, label, "#c8b6f2", what))
        if isinstance(resume, int | float) and "Resume" in lanes:
            label = f"{resume:.1f} s to resume"
            span = (start + detect, start + detect + resume)
            out.append(LaneEvent("Resume", *span, label, "#9fd8c0", what))
    return out


def goodput_chart(account: dict[str, Any]) -> str:
    seconds = account.get("seconds") or {}
    parts = [(label, float(seconds.get(key) or 0.0), c) for key, label, c in GOODPUT_PARTS]
    return stacked_bar(parts, title="Where the run's time went", unit="s")
