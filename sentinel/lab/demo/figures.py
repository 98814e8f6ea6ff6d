"""The report's charts from the demo's recorded data (matplotlib, as inline SVG with a caption
that says in words what each shows). The per-rank heatmaps are in `rankmap`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib import colors
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from sentinel.lab.demo.data import StepPoint
from sentinel.lab.demo.plot import (
    DETECT_COLOUR,
    FAULT_COLOUR,
    MISSING,
    PALETTE,
    REFERENCE_COLOUR,
    Chart,
    chart,
    new_figure,
    styled,
)
from sentinel.lab.demo.readings import (
    GOODPUT_PARTS,
    burnin_nodes,
    measured_links,
    natural_key,
    rolled_back_from,
)


def loss_top(losses: Sequence[float]) -> float | None:
    """Where to cut the loss axis so that one wild spike does not flatten the rest (None: no
    cut). Values above it are drawn pinned to the top and labelled."""
    finite = sorted(v for v in losses if math.isfinite(v))
    if not finite:
        return None
    lo, hi = finite[0], finite[-1]
    q = finite[int(0.95 * (len(finite) - 1))]
    if q > lo and hi > q + 2 * (q - lo):
        return q + 0.6 * (q - lo)
    return None


def markers(result: dict[str, Any]) -> list[tuple[int, str, str, str]]:
    """(step, label, colour, line style) for each injected fault and each detection."""
    out = []
    for f in result.get("faults") or []:
        if isinstance(f.get("injected_step"), int):
            out.append((f["injected_step"], f"✕ {f.get('kind')}", FAULT_COLOUR, "-"))
    for inc in result.get("incidents") or []:
        if isinstance(inc.get("detected_step"), int):
            out.append((inc["detected_step"], f"⚑ {inc.get('kind')}", DETECT_COLOUR, "--"))
    return sorted(out, key=lambda m: m[0])


def loss_caption(steps: Sequence[StepPoint], result: dict[str, Any], top: float | None) -> str:
    cut = rolled_back_from((p.generation, p.step) for p in steps)
    gens = sorted({p.generation for p in steps})
    text = f"Training loss over steps {min(p.step for p in steps)}-{max(p.step for p in steps)}"
    text += f" in {len(gens)} generation(s)."
    for gen, first in sorted(cut.items()):
        last = max(p.step for p in steps if p.generation == gen)
        if last >= first:
            text += f" Generation {gen} trained steps {first}-{last}, then they were rolled back."
    marks = [f"{label[2:]} at step {step}" for step, label, _c, _s in markers(result)]
    if marks:
        text += " Marked: " + "; ".join(marks) + "."
    if top is not None:
        off = [p for p in steps if not (math.isfinite(p.loss) and p.loss <= top)]
        text += " Off the scale: " + ", ".join(f"step {p.step} ({p.loss:.3g})" for p in off) + "."
    return text


@styled
def loss_chart(
    steps: Sequence[StepPoint], reference: Sequence[StepPoint], result: dict[str, Any]
) -> Chart:
    top = loss_top([p.loss for p in [*steps, *reference]])
    fig = new_figure(10.0, 4.2)
    ax = fig.add_subplot()
    ax.grid(True, axis="y")
    if reference:
        ref = sorted(reference, key=lambda p: p.step)
        # A wide pale band under the run's lines: a bit-identical run draws exactly over it,
        # and a thin line there would vanish; a run that parts from it shows at once.
        style = {"color": REFERENCE_COLOUR, "lw": 7.0, "alpha": 0.35, "solid_capstyle": "round"}
        _losses(ax, ref, top, **style, zorder=1, label="clean reference run")
    cut = rolled_back_from((p.generation, p.step) for p in steps)
    for i, gen in enumerate(sorted({p.generation for p in steps})):
        colour = PALETTE[i % len(PALETTE)]
        mine = sorted((p for p in steps if p.generation == gen), key=lambda p: p.step)
        end = cut.get(gen, math.inf)
        kept = [p for p in mine if p.step < end]
        lost = [p for p in mine if p.step >= end - 1]
        if kept:
            _losses(ax, kept, top, color=colour, lw=1.8, label=f"generation {gen}")
        if gen in cut and len(lost) > 1:
            name = f"generation {gen}, rolled back"
            _losses(ax, lost, top, color=colour, lw=1.8, ls="--", label=name)
            ax.axvspan(
                cut[gen],
                mine[-1].step,
                color=MISSING,
                zorder=0,
                label="rolled back, then replayed" if i == 0 else None,
            )
    if top is not None:
        _pin_off_scale(ax, steps, top)
    _step_markers(ax, markers(result))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Training loss per step", pad=30)
    ax.legend(loc="upper right", fontsize=8)
    return chart(fig, "loss", "Training loss per step", loss_caption(steps, result, top))


def _losses(ax: Axes, points: Sequence[StepPoint], top: float | None, **style: Any) -> None:
    """One line of losses by step, values beyond `top` pinned to it."""
    ax.plot([p.step for p in points], [_pin(p.loss, top) for p in points], **style)


def _pin(v: float, top: float | None) -> float:
    return min(v, top) if top is not None and math.isfinite(v) else v


def _pin_off_scale(ax: Axes, steps: Sequence[StepPoint], top: float) -> None:
    """Values beyond the cut (or not finite) sit on the top edge with their value written."""
    lo = ax.get_ylim()[0]
    ax.set_ylim(lo, top * 1.02 if top > 0 else top + 0.1)
    for p in steps:
        if not (math.isfinite(p.loss) and p.loss <= top):
            ax.plot([p.step], [top], marker="^", color=FAULT_COLOUR, ms=7, clip_on=False)
            ax.annotate(
                f"{p.loss:.3g} off scale",
                (p.step, top),
                xytext=(6, -4),
                textcoords="offset points",
                fontsize=8,
                color=FAULT_COLOUR,
                va="top",
            )


def _step_markers(ax: Axes, marks: Sequence[tuple[int, str, str, str]]) -> None:
    """Vertical lines at each fault's and detection's step, labels stacked above the plot."""
    span = max(1.0, ax.get_xlim()[1] - ax.get_xlim()[0])
    last: list[float] = []  # the step of the label last placed on each level
    for step, label, colour, style in marks:
        ax.axvline(step, color=colour, ls=style, lw=1.2)
        level = next((i for i, s in enumerate(last) if step - s > 0.12 * span), len(last))
        last[level : level + 1] = [step]
        ax.annotate(
            label,
            (step, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, 2 + 10 * level),
            textcoords="offset points",
            fontsize=8,
            color=colour,
            va="bottom",
        )


def link_matrix(report: dict[str, Any]) -> tuple[list[str], np.ndarray, set[tuple[int, int]]]:
    """Nodes, the slowest measured GB/s between each pair (NaN: not measured), failed pairs."""
    nodes = burnin_nodes(report)
    index = {n: i for i, n in enumerate(nodes)}
    matrix = np.full((len(nodes), len(nodes)), np.nan)
    flagged: set[tuple[int, int]] = set()
    for link in measured_links(report):
        a, b = index[str(link["a"])], index[str(link["b"])]
        for i, j in {(a, b), (b, a)}:
            matrix[i, j] = np.fmin(matrix[i, j], float(link["gbps"]))
            if link.get("verdict", "pass") != "pass":
                flagged.add((i, j))
    return nodes, matrix, flagged


@styled
def burnin_heatmap(report: dict[str, Any]) -> Chart:
    nodes, matrix, flagged = link_matrix(report)
    size = min(8.0, 2.6 + 0.55 * len(nodes))
    fig = new_figure(size + 1.2, size)
    ax = fig.add_subplot()
    ax.set_facecolor(MISSING)
    finite = matrix[np.isfinite(matrix)]
    norm = colors.Normalize(float(finite.min()), float(max(finite.max(), finite.min() + 1e-9)))
    mesh = ax.pcolormesh(
        np.ma.masked_invalid(matrix), cmap="viridis", norm=norm, edgecolors="white", linewidth=1
    )
    for i in range(len(nodes)):
        for j in range(len(nodes)):
            v = matrix[i, j]
            text = "—" if not np.isfinite(v) else f"{v:.3g}"
            dark = np.isfinite(v) and norm(v) < 0.55
            ax.text(
                j + 0.5,
                i + 0.5,
                text,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "#1f2328",
            )
    for i, j in flagged:
        ax.add_patch(
            Rectangle((j + 0.06, i + 0.06), 0.88, 0.88, fill=False, edgecolor=FAULT_COLOUR, lw=2.2)
        )
    ax.set_xticks(np.arange(len(nodes)) + 0.5, nodes, rotation=45, ha="right")
    ax.set_yticks(np.arange(len(nodes)) + 0.5, nodes)
    ax.set_ylim(len(nodes), 0)
    ax.set_aspect("equal")
    ax.set_xlabel("node")
    ax.set_ylabel("node")
    fig.colorbar(mesh, ax=ax, fraction=0.05, pad=0.02).set_label("GB/s")
    title = "Burn-in link bandwidth (GB/s)"
    ax.set_title(title)
    slow = sorted({f"{nodes[i]}<->{nodes[j]}" for i, j in flagged if i < j}, key=natural_key)
    caption = (
        f"Measured link bandwidth between {len(nodes)} nodes, "
        f"{float(finite.min()):.3g} to {float(finite.max()):.3g} GB/s. "
        + (f"Failed links (outlined in red): {', '.join(slow)}." if slow else "No link failed.")
    )
    return chart(fig, "burnin-links", title, caption)


@styled
def goodput_chart(account: dict[str, Any]) -> Chart:
    """The run's wall time as one bar, a segment per category of the time account."""
    seconds = account.get("seconds") or {}
    parts = [(label, float(seconds.get(key) or 0.0), c) for key, label, c in GOODPUT_PARTS]
    total = sum(v for _l, v, _c in parts) or 1.0
    fig = new_figure(10.0, 2.4)
    ax = fig.add_subplot()
    left = 0.0
    for label, v, colour in parts:
        ax.barh(
            0, v, left=left, color=colour, edgecolor="white", height=0.6, label=f"{label} {v:.1f} s"
        )
        if v / total >= 0.05:
            ax.text(
                left + v / 2,
                0,
                f"{100 * v / total:.0f}%",
                ha="center",
                va="center",
                fontsize=9,
                fontweight="bold",
                color="#1f2328",
            )
        left += v
    ax.set_xlim(0, total)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("seconds of the run's wall time")
    title = "Where the run's time went"
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=4, fontsize=8)
    caption = f"The run's {total:.1f} s of wall time by category: " + ", ".join(
        f"{label} {v:.1f} s ({100 * v / total:.0f}%)" for label, v, _c in parts
    )
    return chart(fig, "goodput", title, caption + ".")
