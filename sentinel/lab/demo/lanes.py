"""The incident timeline chart: one lane per kind of entry, by time since the demo started,
with bars for each fault's measured time to detect and time to resume. Labels that would
overlap are left out of the chart, the entries' and the bars' alike; the table under it lists
every entry and the caption every bar."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.axes import Axes

from sentinel.lab.demo.data import TimelineEntry
from sentinel.lab.demo.plot import (
    DETECT_COLOUR,
    FAULT_COLOUR,
    MUTED,
    Chart,
    chart,
    new_figure,
    place_labels,
    styled,
)

LANES = (
    ("Faults", ("fault",), FAULT_COLOUR),
    ("Detection", ("detect", "incident"), DETECT_COLOUR),
    ("Actions", ("action",), "#0072B2"),
    ("Resume", ("resume",), "#009E73"),
    ("Burn-in", ("burnin",), "#E69F00"),
    ("Info", ("info",), MUTED),
)
LABEL_LEVELS = 3  # label rows per lane before a label is left to the table
BAR_LABEL_LEVELS = 1  # a bar's label sits on its bar, in one row
LABEL_CHARS = 28
WIDTH_IN = 10.0


@dataclass(frozen=True)
class Span:
    """A bar on a lane from `start` to `end` (demo seconds)."""

    lane: str
    start: float
    end: float
    label: str
    colour: str


def repair_spans(
    entries: Sequence[TimelineEntry], faults: Sequence[dict[str, Any]], lanes: Sequence[str]
) -> list[Span]:
    """Bars for each fault's measured time to detect (from its injection entry) and time to
    resume (from detection), on the Detection and Resume lanes where those exist. `faults` are
    the result's, in the scenario's order: fault i's injection is the entry `fault:i` (a rank's
    fault strikes on a node, a batch on none: their targets never matched the result's)."""
    out = []
    for i, f in enumerate(faults):
        injected = (e.t for e in entries if e.kind == "fault" and e.ref == f"fault:{i}")
        start = next(injected, None)
        detect, resume = f.get("time_to_detect_s"), f.get("time_to_resume_s")
        if start is None or not isinstance(detect, int | float):
            continue
        if "Detection" in lanes:
            out.append(
                Span("Detection", start, start + detect, f"{detect:.1f} s to detect", "#c8b6f2")
            )
        if isinstance(resume, int | float) and "Resume" in lanes:
            end = start + detect + resume
            out.append(Span("Resume", start + detect, end, f"{resume:.1f} s to resume", "#9fd8c0"))
    return out


def short(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def labelled_bars(spans: Sequence[Span], span_s: float) -> list[Span]:
    """The bars whose labels fit on each lane without overlapping another's (the caption
    names every bar's measurement)."""
    out = []
    for lane in dict.fromkeys(s.lane for s in spans):
        mine = sorted((s for s in spans if s.lane == lane), key=lambda s: s.start)
        texts = [f" {s.label}" for s in mine]
        rows = place_labels([s.start for s in mine], texts, span_s, WIDTH_IN, BAR_LABEL_LEVELS)
        out += [s for s, row in zip(mine, rows, strict=True) if row is not None]
    return out


@styled
def timeline_chart(entries: Sequence[TimelineEntry], result: dict[str, Any]) -> Chart:
    lanes = [(name, kinds, c) for name, kinds, c in LANES if any(e.kind in kinds for e in entries)]
    names = [name for name, _k, _c in lanes]
    spans = repair_spans(entries, result.get("faults") or [], names)
    t_end = max([e.t for e in entries] + [s.end for s in spans])
    fig = new_figure(WIDTH_IN, 1.0 + 0.75 * len(lanes))
    ax = fig.add_subplot()
    ax.set_xlim(0, max(1.0, t_end * 1.02))
    ax.set_ylim(len(lanes) - 0.4, -0.6)
    ax.set_yticks(range(len(lanes)), names)
    ax.grid(True, axis="x")
    for s in spans:
        y = names.index(s.lane)
        ax.barh(y + 0.22, s.end - s.start, left=s.start, height=0.22, color=s.colour)
    for s in labelled_bars(spans, ax.get_xlim()[1]):
        y = names.index(s.lane)
        ax.text(s.start, y + 0.22, f" {s.label}", va="center", fontsize=7, color="#1f2328")
    for y, (_name, kinds, colour) in enumerate(lanes):
        mine = sorted((e for e in entries if e.kind in kinds), key=lambda e: e.t)
        _lane(ax, y, mine, colour, ax.get_xlim()[1])
    ax.set_xlabel("seconds since the demo started")
    title = "Faults, detection, repair and resume over time"
    ax.set_title(title)
    return chart(fig, "timeline", title, timeline_caption(entries, spans))


def _lane(ax: Axes, y: int, mine: Sequence[TimelineEntry], colour: str, span_s: float) -> None:
    ax.scatter([e.t for e in mine], [y] * len(mine), marker="D", s=28, color=colour, zorder=3)
    texts = [short(e.text) for e in mine]
    for e, text, level in zip(
        mine,
        texts,
        place_labels([e.t for e in mine], texts, span_s, WIDTH_IN, LABEL_LEVELS),
        strict=True,
    ):
        if level is not None:
            ax.annotate(
                text,
                (e.t, y),
                xytext=(-3, 6 + 9 * level),
                textcoords="offset points",
                fontsize=7,
                color="#1f2328",
                va="bottom",
            )


def timeline_caption(entries: Sequence[TimelineEntry], spans: Sequence[Span]) -> str:
    firsts = [
        e
        for e in sorted(entries, key=lambda e: e.t)
        if e.kind in ("fault", "detect", "incident", "resume")
    ]
    text = f"{len(entries)} timeline entries over {max(e.t for e in entries):.0f} s."
    if firsts:
        text += " " + "; ".join(f"{e.t:.1f} s: {e.text}" for e in firsts[:12]) + "."
    if spans:
        text += " Measured: " + ", ".join(s.label for s in spans) + "."
    return text + " The table below lists every entry."
