"""The per-rank heatmaps (step time, MFU): one block of rows per gang generation, each rank
labelled with the node it actually ran on in that generation, every generation's samples kept.

What a reader must be able to see: the steps a generation trained and then lost to a rollback
(hatched; the next generation's rows show them again), the step each rank was in when its
generation stopped (a hang or crash never reports that step, so it is drawn as unfinished),
and the checkpoint saves (dotted lines after the step saved: the step after a save carries its
cost, which is not an incident).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from matplotlib import colors
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from sentinel.lab.demo.data import RankSample, StepPoint
from sentinel.lab.demo.plot import (
    FAULT_COLOUR,
    MISSING,
    MUTED,
    Chart,
    chart,
    new_figure,
    place_labels,
    styled,
)
from sentinel.lab.demo.readings import rolled_back_from
from sentinel.lab.demo.result import Generation

HATCH = "////"
SATURATE_AT = 3.0  # times the median: beyond it cells take the scale's end colour
FIGURE_WIDTH_IN = 10.0


@dataclass
class Block:
    """One generation's rows. `values[(rank, step)]`; `lost_from`: its first step a later
    generation trained again; `unfinished[rank]`: the step in progress when it stopped;
    `stopped_for_s`: seconds from its last report to the next generation's launch;
    `relaunch_s`: from its gang's teardown to that launch (the relaunch itself)."""

    generation: int
    nodes: tuple[str, ...] | None
    ranks: list[int]
    values: dict[tuple[int, int], float] = field(default_factory=dict)
    lost_from: int | None = None
    unfinished: dict[int, int] = field(default_factory=dict)
    stopped_for_s: float | None = None
    relaunch_s: float | None = None

    @property
    def steps(self) -> list[int]:
        return sorted({s for _r, s in self.values})


def node_of(nodes: tuple[str, ...] | None, rank: int, gpus_per_node: int) -> str | None:
    """The node that hosted `rank` in a generation launched on `nodes` (node K holds ranks
    K * gpus_per_node onwards)."""
    k = rank // max(1, gpus_per_node)
    return nodes[k] if nodes is not None and k < len(nodes) else None


def value_of(s: RankSample, field_name: str) -> float | None:
    v = s.step_s if field_name == "step_s" else s.mfu
    return float(v) if v is not None and math.isfinite(v) else None


def blocks(
    samples: Sequence[RankSample],
    generations: Sequence[Generation],
    field_name: str,
    finished: bool,
    steps: Sequence[StepPoint] = (),
) -> list[Block]:
    """The generations that reported steps, in order. A generation followed by another (or the
    last one of a run that did not finish) left each rank in an unfinished step: the one after
    both the rank's last report and the last step the trainer's metrics closed in that
    generation (ranks may report only every few steps; the metrics close every one)."""
    launched = {g.number: g for g in generations}
    numbers = sorted({s.generation for s in samples})
    trained = [(s.generation, s.step) for s in samples] + [(p.generation, p.step) for p in steps]
    cut = rolled_back_from(trained)
    out = []
    for i, n in enumerate(numbers):
        mine = [s for s in samples if s.generation == n]
        gen = launched.get(n)
        block = Block(n, gen.nodes if gen else None, sorted({s.rank for s in mine}))
        block.lost_from = cut.get(n)
        for s in mine:
            v = value_of(s, field_name)
            if v is not None:
                block.values[(s.rank, s.step)] = v
        later = [g for g in generations if g.number > n]
        if later or i < len(numbers) - 1 or not finished:
            closed = max((p.step for p in steps if p.generation == n), default=0)
            for r in block.ranks:
                block.unfinished[r] = max(closed, *(s.step for s in mine if s.rank == r)) + 1
        if later:
            launch = min(g.t for g in later)
            block.stopped_for_s = launch - max(s.t for s in mine)
            if gen is not None and gen.stopped_t is not None:
                block.relaunch_s = max(0.0, launch - gen.stopped_t)
        out.append(block)
    return out


def hold_until_next_report(row: np.ndarray, cols: Sequence[int], stride: int) -> None:
    """Columns between two of a rank's reports (another generation's steps, an unfinished
    step) take the next report's colour, so a rank reporting every `stride` steps reads as a
    continuous row, not as one with holes where nothing went wrong. A report covers the
    `stride` steps up to its own (`cols`: each column's step), no more: a replica that heals
    from a live peer jumps from its first step to its peers', and the steps it skipped stay
    empty."""
    finite = [int(i) for i in np.flatnonzero(np.isfinite(row))]
    for a, b in itertools.pairwise(finite):
        covered = [j for j in range(a + 1, b) if cols[j] > cols[b] - stride]
        row[covered] = row[b]


def report_stride(samples: Sequence[RankSample]) -> int:
    """Every how many steps a rank reported (1 when each step was)."""
    gaps = {
        b.step - a.step
        for a, b in itertools.pairwise(
            sorted(samples, key=lambda s: (s.generation, s.rank, s.step))
        )
        if (a.generation, a.rank) == (b.generation, b.rank) and b.step > a.step
    }
    return min(gaps, default=1)


def colour_norm(values: list[float], field_name: str) -> tuple[colors.Normalize, str]:
    """A scale that a warm-up step or a stall does not flatten: beyond SATURATE_AT times the
    median (or below the median over it, for MFU) cells take the end colour."""
    lo, hi, med = min(values), max(values), statistics.median(values)
    extend = "neither"
    if field_name == "step_s" and med > 0 and hi > SATURATE_AT * med:
        hi, extend = SATURATE_AT * med, "max"
    if field_name == "mfu" and med > 0 and lo < med / SATURATE_AT:
        lo, extend = med / SATURATE_AT, "min"
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0) * 0.1
    return colors.Normalize(lo, hi), extend


def _span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def describe(bs: Sequence[Block], gpus_per_node: int, checkpoints: Sequence[int], what: str) -> str:
    """The heatmap in words (its caption and text alternative)."""
    ranks = sorted({r for b in bs for r in b.ranks})
    parts = [f"{what} of {len(ranks)} ranks in {len(bs)} generation(s)."]
    for b in bs:
        steps = b.steps
        where = f" on {', '.join(b.nodes)}" if b.nodes else ""
        text = f"Generation {b.generation}{where}"
        text += f" trained steps {_span(steps)}" if steps else " reported no step"
        if b.lost_from is not None and steps and steps[-1] >= b.lost_from:
            text += f", of which {_span([b.lost_from, steps[-1]])} were rolled back"
        stuck = sorted(set(b.unfinished.values()))
        if stuck:
            text += f"; step {', '.join(map(str, stuck))} never finished"
            if b.stopped_for_s is not None:
                text += f" (no report in the {b.stopped_for_s:.1f} s before the next launch"
                if b.relaunch_s is not None:
                    text += f", which came {b.relaunch_s:.1f} s after the gang was stopped"
                text += ")"
        parts.append(text + ".")
    if checkpoints:
        parts.append(f"Checkpoints saved after steps {', '.join(map(str, checkpoints))}.")
    return " ".join(parts)


def rank_heatmap(
    samples: Sequence[RankSample],
    generations: Sequence[Generation],
    gpus_per_node: int,
    checkpoints: Sequence[int],
    field_name: str,
    finished: bool = True,
    steps: Sequence[StepPoint] = (),
) -> Chart:
    bs = blocks(samples, generations, field_name, finished, steps)
    scale = 1.0
    if field_name == "step_s":
        title, unit, ident, what = "Step time per rank", "s", "rank-step-time", "Step time"
    else:
        title, ident, what = "Model FLOPs utilisation per rank", "rank-mfu", "MFU"
        flat = [v for b in bs for v in b.values.values()]
        scale, unit = (100.0, "% MFU") if flat and max(flat) <= 1.0 else (1.0, "MFU")
    caption = describe(bs, gpus_per_node, checkpoints, what)
    stride = report_stride(samples)
    if stride > 1:
        caption += (
            f" Ranks report every {stride} steps: a report's colour fills the steps before it."
        )
    shown = {b.generation for b in bs}
    for g in generations:
        if g.number not in shown:  # launched, but stopped before any rank reported a step
            caption += f" Generation {g.number} on {', '.join(g.nodes)} reported no step."
    return draw_heatmap(
        bs, gpus_per_node, checkpoints, field_name, scale, unit, title, ident, caption, stride
    )


@styled
def draw_heatmap(
    bs: Sequence[Block],
    gpus_per_node: int,
    checkpoints: Sequence[int],
    field_name: str,
    scale: float,
    unit: str,
    title: str,
    ident: str,
    caption: str,
    stride: int = 1,
) -> Chart:
    rows = [(b, r) for b in bs for r in b.ranks]
    cols = sorted({s for b in bs for s in b.steps} | {s for b in bs for s in b.unfinished.values()})
    edges = np.array(
        [cols[0] - 0.5] + [(a + b) / 2 for a, b in itertools.pairwise(cols)] + [cols[-1] + 0.5]
    )
    col_of = {s: i for i, s in enumerate(cols)}
    z = np.full((len(rows), len(cols)), np.nan)
    for i, (b, r) in enumerate(rows):
        for (rank, step), v in b.values.items():
            if rank == r:
                z[i, col_of[step]] = v * scale
        hold_until_next_report(z[i], cols, stride)
    values = [float(v) for v in z[np.isfinite(z)]]
    norm, extend = colour_norm(values or [0.0, 1.0], field_name)
    fig = new_figure(FIGURE_WIDTH_IN, max(2.8, 1.9 + 0.2 * len(rows)))
    ax = fig.add_subplot()
    ax.set_facecolor(MISSING)
    cmap = "viridis" if field_name == "step_s" else "viridis_r"
    mesh = ax.pcolormesh(
        edges,
        np.arange(len(rows) + 1),
        np.ma.masked_invalid(z),
        cmap=cmap,
        norm=norm,
        rasterized=True,
    )
    ax.set_ylim(len(rows), 0)
    ax.set_xlim(edges[0], edges[-1])
    ax.set_yticks(np.arange(len(rows)) + 0.5)
    labels = []
    for b, r in rows:
        node = node_of(b.nodes, r, gpus_per_node)
        labels.append(f"g{b.generation} · rank {r}" + (f" · {node}" if node else ""))
    ax.set_yticklabels(labels, fontsize=8)
    ax.tick_params(axis="y", length=0)
    _mark_blocks(ax, bs, edges, col_of)
    _mark_checkpoints(ax, checkpoints, edges)
    bar = fig.colorbar(mesh, ax=ax, extend=extend, fraction=0.03, pad=0.01)
    bar.set_label(unit)
    ax.set_xlabel("step")
    ax.set_ylabel("generation · rank · node it ran on")
    ax.set_title(title, pad=14)
    fig.legend(handles=_legend(), loc="outside lower center", ncols=4, fontsize=8)
    return chart(fig, ident, title, caption)


def _mark_blocks(ax: Axes, bs: Sequence[Block], edges: np.ndarray, col_of: dict[int, int]) -> None:
    """Per generation: a separating line, its lost steps hatched, its unfinished step red."""
    top = 0
    for b in bs:
        n = len(b.ranks)
        if top:
            ax.axhline(top, color="white", lw=2.5)
        steps = b.steps
        if b.lost_from is not None and steps and steps[-1] >= b.lost_from:
            first = min(s for s in steps if s >= b.lost_from)
            x0, x1 = edges[col_of[first]], edges[col_of[steps[-1]] + 1]
            ax.add_patch(
                Rectangle((x0, top), x1 - x0, n, fill=False, hatch=HATCH, edgecolor=MUTED, lw=0.8)
            )
        for i, r in enumerate(b.ranks):
            if r in b.unfinished:
                c = col_of[b.unfinished[r]]
                ax.add_patch(
                    Rectangle(
                        (edges[c], top + i),
                        edges[c + 1] - edges[c],
                        1,
                        facecolor=FAULT_COLOUR,
                        edgecolor="white",
                        lw=0.5,
                    )
                )
        if b.unfinished:
            step = max(b.unfinished.values())
            right = edges[col_of[step] + 1]
            note = f" ✕ step {step} unfinished"
            if b.relaunch_s is not None:
                note += f" (stopped; relaunched {b.relaunch_s:.1f} s later)"
            elif b.stopped_for_s is not None:
                note += f" (silent {b.stopped_for_s:.0f} s before the next launch)"
            near_end = right > edges[0] + 0.6 * (edges[-1] - edges[0])
            x = edges[col_of[min(b.unfinished.values())]] if near_end else right
            ax.text(
                x,
                top + n / 2,
                note.strip() + " " if near_end else note,
                va="center",
                ha="right" if near_end else "left",
                fontsize=8,
                color=FAULT_COLOUR,
                bbox={"facecolor": "white", "alpha": 0.9, "edgecolor": "none", "pad": 1.5},
            )
        top += n


def _mark_checkpoints(ax: Axes, checkpoints: Sequence[int], edges: np.ndarray) -> None:
    """A dotted line after each step a checkpoint saved, labelled above the map where the label
    fits beside the one before it (a save asked for a step after a periodic one shares its
    label; the caption lists every save)."""
    shown = [c for c in checkpoints if edges[0] < c + 0.5 < edges[-1]]
    texts = [f"ckpt {c}" for c in shown]
    span = float(edges[-1] - edges[0])
    rows = place_labels([c + 0.5 for c in shown], texts, span, FIGURE_WIDTH_IN, levels=1)
    for c, text, row in zip(shown, texts, rows, strict=True):
        x = c + 0.5
        ax.axvline(x, color="#24292f", lw=1.0, ls=(0, (1, 2)))
        if row is None:
            continue
        ax.annotate(
            text,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
            color="#24292f",
        )


def _legend() -> list[Patch | Line2D]:
    return [
        Patch(facecolor="white", edgecolor=MUTED, hatch=HATCH, label="trained, then rolled back"),
        Patch(facecolor=FAULT_COLOUR, label="unfinished when its generation stopped"),
        Line2D([], [], color="#24292f", lw=1.0, ls=(0, (1, 2)), label="checkpoint saved"),
        Patch(facecolor=MISSING, edgecolor=MUTED, lw=0.5, label="no sample"),
    ]
