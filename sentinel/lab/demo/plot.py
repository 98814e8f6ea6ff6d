"""Matplotlib, set up once for the report: figures without pyplot's global state, written as
inline SVG that a page can hold several of (ids made unique per chart) and that a screen reader
can name (a `<title>` and a `<desc>` the page's caption repeats).

Matplotlib is the demo's optional dependency (`pip install 'sentinel[demo]'`); importing this
module without it raises ImportError, which the report turns into a note.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, ParamSpec

import matplotlib
from matplotlib.figure import Figure

P = ParamSpec("P")

# Colour-blind-safe (Okabe-Ito), in the order generations and categories take them.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
INK, MUTED, GRID, MISSING = "#1f2328", "#57606a", "#d8dee4", "#eef1f4"
FAULT_COLOUR, DETECT_COLOUR, REFERENCE_COLOUR = "#d1242f", "#8250df", "#8c959f"

STYLE: dict[Any, Any] = {  # keys: matplotlib rcParams
    # Text stays text: the browser draws it, a reader can select and search it, and the page
    # does not carry every glyph's outline.
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 10,
    "text.color": INK,
    "axes.edgecolor": GRID,
    "axes.labelcolor": INK,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "grid.color": GRID,
    "xtick.color": MUTED,
    "ytick.color": MUTED,
    "legend.frameon": False,
    "legend.fontsize": 9,
    "hatch.color": "#57606a",
    "hatch.linewidth": 0.6,
    # Rasterised parts (a heatmap's cells) at a resolution that stays crisp when zoomed.
    "savefig.dpi": 200,
}


@dataclass(frozen=True)
class Chart:
    """One figure of the report: inline SVG, and the caption that says what it shows in words
    (also the SVG's accessible description)."""

    ident: str
    title: str
    svg: str
    caption: str


def styled(draw: Callable[P, Chart]) -> Callable[P, Chart]:
    """Draw under the report's style (matplotlib reads it as each piece is made)."""

    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Chart:
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    return wrapper


CHAR_IN = 0.065  # the width of one 7-8 point character, in inches, near enough to avoid overlaps


def place_labels(
    xs: Sequence[float], texts: Sequence[str], span: float, width_in: float, levels: int
) -> list[int | None]:
    """A label row for each of the labels at `xs` (ascending), of at most `levels` (None: no
    room left), so that no two labels overlap on axes `span` wide in data units, drawn in a
    figure `width_in` inches wide (the axes take about 80% of it)."""
    per_unit = span / (width_in * 0.8)  # data units per inch of plot
    ends: list[float] = []  # right end of the last label on each row
    out: list[int | None] = []
    for x, text in zip(xs, texts, strict=True):
        level = next((i for i, end in enumerate(ends) if x > end), None)
        if level is None and len(ends) < levels:
            level = len(ends)
            ends.append(-math.inf)
        if level is not None:
            ends[level] = x + len(text) * CHAR_IN * per_unit + 0.1 * per_unit
        out.append(level)
    return out


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure of its own (no pyplot: nothing global, safe to build several at once)."""
    return Figure(figsize=(width_in, height_in), layout="constrained")


def chart(fig: Figure, ident: str, title: str, caption: str) -> Chart:
    return Chart(ident, title, to_svg(fig, ident, title, caption), caption)


def to_svg(fig: Figure, ident: str, title: str, desc: str) -> str:
    """The figure as an `<svg>` element for inline use: every id prefixed with `ident` (two
    charts' clip paths must not clash), no XML prolog or metadata, named for assistive tech."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": ident}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r'\bid="([^"]+)"', rf'id="{ident}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{ident}-\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{ident}-\1"', text)
    head = (
        f'<svg class="chart" role="img" aria-labelledby="{ident}-title {ident}-desc" '
        f'data-chart="{ident}"'
    )
    text = head + text[len("<svg") :]
    end = text.index(">") + 1
    named = f'<title id="{ident}-title">{escape(title)}</title><desc id="{ident}-desc">{escape(desc)}</desc>'
    return text[:end] + named + text[end:]
