"""Small inline-SVG plotting helpers for the demo report: no dependency, no script.

Every chart is a function from plain data to one `<svg>` string. All text goes through `esc`;
every mark carries a `<title>` child so a browser shows its exact value on hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
INK = "#1f2328"
MUTED = "#57606a"
GRID = "#d8dee4"
# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
# Viridis, sampled at ten even stops: perceptually uniform and legible in greyscale.
VIRIDIS = (
    "#440154",
    "#482878",
    "#3e4989",
    "#31688e",
    "#26828e",
    "#1f9e89",
    "#35b779",
    "#6ece58",
    "#b5de2b",
    "#fde725",
)
MISSING = "#eef1f4"
BAND = "band"  # legend swatch style: a shaded box instead of a line


def esc(text: object) -> str:
    """Escape any value for SVG/HTML text and attribute context."""
    return escape(str(text), quote=True)


def num(value: float) -> str:
    """A coordinate written compactly (two decimals at most)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def text_width(text: str, size: float) -> float:
    """Rough rendered width of `text` in the system sans font (for label placement)."""
    return 0.58 * size * len(text)


class LinearScale:
    """Maps a data interval onto a pixel interval; a degenerate domain maps to its middle."""

    def __init__(self, domain: tuple[float, float], out: tuple[float, float]) -> None:
        self.domain = domain
        self.out = out

    def __call__(self, value: float) -> float:
        d0, d1 = self.domain
        r0, r1 = self.out
        if d1 == d0:
            return (r0 + r1) / 2
        return r0 + (value - d0) * (r1 - r0) / (d1 - d0)


def nice_step(lo: float, hi: float, count: int = 5) -> float:
    """A 1-2-5 x 10^k step giving about `count` intervals over [lo, hi]."""
    span = abs(hi - lo)
    if span == 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(count, 1)
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if raw <= step * mult * 1.0001:
            return step * mult
    return step * 10


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (inclusive where they fall on it)."""
    if lo > hi:
        lo, hi = hi, lo
    if lo == hi:
        return [lo]
    step = nice_step(lo, hi, count)
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [_clean(i * step) for i in range(first, last + 1)]


def nice_domain(lo: float, hi: float, count: int = 5) -> tuple[float, float]:
    """[lo, hi] widened outward to round tick values; a flat range gets some headroom."""
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(lo, hi, count)
    return _clean(math.floor(lo / step + 1e-9) * step), _clean(math.ceil(hi / step - 1e-9) * step)


def _clean(value: float) -> float:
    return float(f"{value:.12g}")


def fmt_tick(value: float) -> str:
    """A tick label: no float noise, thousands as 'k' past 10 000."""
    if abs(value) >= 10_000:
        return f"{value / 1000:g}k"
    return f"{_clean(value):g}"


def mix(c0: str, c1: str, f: float) -> str:
    """Linear RGB interpolation between two #rrggbb colours."""
    a = [int(c0[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(c1[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


def luminance(colour: str) -> float:
    """Relative luminance (WCAG) of a #rrggbb colour, to pick readable text on it."""

    def channel(hexpair: str) -> float:
        c = int(hexpair, 16) / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(colour[i : i + 2]) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ink_on(colour: str) -> str:
    return INK if luminance(colour) > 0.22 else "#ffffff"


class ColourScale:
    """Maps values onto viridis (low = dark purple, high = yellow), linearly or by log."""

    def __init__(self, lo: float, hi: float, *, log: bool = False, saturated: bool = False) -> None:
        if log and (lo <= 0 or hi <= 0):
            raise ValueError("a log colour scale needs positive bounds")
        self.lo, self.hi, self.log = min(lo, hi), max(lo, hi), log
        self.saturated = saturated  # values above `hi` exist and share its colour

    @classmethod
    def for_values(cls, values: Sequence[float]) -> ColourScale:
        """Linear over the values; when a few outliers (a hang's step) exceed 3x the 95th
        percentile, colours saturate there so the rest (a 1.3x straggler) still shows."""
        finite = sorted(v for v in values if math.isfinite(v))
        if not finite:
            return cls(0.0, 1.0)
        lo, hi = finite[0], finite[-1]
        p95 = finite[int(0.95 * (len(finite) - 1))]
        if p95 > lo and hi > 3 * p95 > 0:
            return cls(lo, p95, saturated=True)
        return cls(lo, hi)

    def fraction(self, value: float) -> float:
        if self.hi == self.lo:
            return 0.5
        if self.log:
            f = (math.log(max(value, self.lo)) - math.log(self.lo)) / math.log(self.hi / self.lo)
        else:
            f = (value - self.lo) / (self.hi - self.lo)
        return min(1.0, max(0.0, f))

    def colour(self, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return MISSING
        pos = self.fraction(value) * (len(VIRIDIS) - 1)
        i = min(int(pos), len(VIRIDIS) - 2)
        return mix(VIRIDIS[i], VIRIDIS[i + 1], pos - i)

    def ticks(self) -> list[float]:
        if not self.log:
            return nice_ticks(self.lo, self.hi, 4)
        out = []
        for k in range(math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi)) + 1):
            out += [m * 10**k for m in (1, 2, 5) if self.lo <= m * 10**k <= self.hi]
        return [_clean(v) for v in out] or [self.lo, self.hi]


# -- shared pieces ---------------------------------------------------------------------------


def _open_svg(width: float, height: float, title: str, css_class: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {esc(css_class)}" '
        f'viewBox="0 0 {num(width)} {num(height)}" width="100%" style="max-width:{num(width)}px" '
        f'role="img" '
        f'font-family="{esc(FONT)}" font-size="12" fill="{INK}">',
        f"<title>{esc(title)}</title>",
        f'<text x="0" y="18" font-size="15" font-weight="600">{esc(title)}</text>',
    ]


def _text(x: float, y: float, body: str, **attrs: str | float) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    return f'<text x="{num(x)}" y="{num(y)}"{extra}>{esc(body)}</text>'


def _legend(
    items: Sequence[tuple[str, str, str | None]], x: float, y: float, width: float
) -> tuple[list[str], float]:
    """Swatches in rows from (x, y); returns the marks and the height used."""
    out, cx, cy = [], x, y
    for label, colour, dash in items:
        w = 28 + text_width(label, 12) + 16
        if cx + w > x + width and cx > x:
            cx, cy = x, cy + 18
        dash_attr = f' stroke-dasharray="{esc(dash)}"' if dash else ""
        swatch = (
            f'<rect x="{num(cx)}" y="{num(cy - 10)}" width="22" height="12" fill="{esc(colour)}" '
            f'fill-opacity="0.25"/>'
            if dash == BAND
            else f'<line x1="{num(cx)}" y1="{num(cy - 4)}" x2="{num(cx + 22)}" y2="{num(cy - 4)}" '
            f'stroke="{esc(colour)}" stroke-width="3"{dash_attr}/>'
        )
        out.append(f'<g class="legend-item">{swatch}{_text(cx + 28, cy, label)}</g>')
        cx += w
    return out, (cy - y + 18) if items else 0.0


def place_labels(
    spans: Sequence[tuple[float, float]], rows: int, gap: float = 6
) -> list[int | None]:
    """Greedy row per label at pixel extents (x0, x1), left to right; None where none fits."""
    ends = [-math.inf] * rows
    out: list[int | None] = [None] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        x0, x1 = spans[i]
        row = next((r for r in range(rows) if ends[r] + gap <= x0), None)
        if row is not None:
            ends[row] = x1
        out[i] = row
    return out


def label_extents(
    xs: Sequence[float], labels: Sequence[str], size: float, right: float
) -> tuple[list[tuple[float, float]], list[bool]]:
    """Pixel extent of each label set right of its x, or left of it (flipped) where it would
    run past `right`."""
    spans, flips = [], []
    for x, label in zip(xs, labels, strict=True):
        w = text_width(label, size)
        flip = x + 4 + w > right
        spans.append((x - w - 4, x + 4) if flip else (x - 4, x + w + 4))
        flips.append(flip)
    return spans, flips


def _x_axis(
    scale: LinearScale, ticks: Sequence[float], y0: float, y1: float, label: str
) -> list[str]:
    out = []
    for t in ticks:
        x = scale(t)
        out.append(
            f'<line x1="{num(x)}" y1="{num(y0)}" x2="{num(x)}" y2="{num(y1)}" stroke="{GRID}"/>'
        )
        out.append(_text(x, y1 + 16, fmt_tick(t), text_anchor="middle", fill=MUTED))
    mid = (scale.out[0] + scale.out[1]) / 2
    out.append(_text(mid, y1 + 34, label, text_anchor="middle", fill=MUTED))
    return out


def _y_axis(
    scale: LinearScale, ticks: Sequence[float], x0: float, x1: float, label: str
) -> list[str]:
    out = []
    for t in ticks:
        y = scale(t)
        out.append(
            f'<line x1="{num(x0)}" y1="{num(y)}" x2="{num(x1)}" y2="{num(y)}" stroke="{GRID}"/>'
        )
        out.append(_text(x0 - 6, y + 4, fmt_tick(t), text_anchor="end", fill=MUTED))
    mid = (scale.out[0] + scale.out[1]) / 2
    out.append(
        f'<text x="{num(x0 - 48)}" y="{num(mid)}" text-anchor="middle" fill="{MUTED}" '
        f'transform="rotate(-90 {num(x0 - 48)} {num(mid)})">{esc(label)}</text>'
    )
    return out


# -- line chart ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One line; non-finite y values break it, values past the y domain are pinned and flagged."""

    name: str
    points: Sequence[tuple[float, float]]
    colour: str
    width: float = 2.0
    dash: str | None = None
    opacity: float = 1.0
    legend: bool = True


@dataclass(frozen=True)
class VMarker:
    """A vertical annotation line at `x` with a short label above the plot."""

    x: float
    label: str
    colour: str
    dash: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Band:
    """A shaded x range (e.g. steps that were rolled back)."""

    x0: float
    x1: float
    label: str
    colour: str = "#8c959f"


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    markers: Sequence[VMarker] = (),
    bands: Sequence[Band] = (),
    y_domain: tuple[float, float] | None = None,
    width: float = 960,
    plot_height: float = 260,
) -> str:
    xs = [x for s in series for x, _ in s.points] + [m.x for m in markers]
    ys = [y for s in series for _, y in s.points if math.isfinite(y)]
    if not xs or not ys:
        raise ValueError("a line chart needs at least one finite point")
    left, right = 64.0, 16.0
    legend_items = [(s.name, s.colour, s.dash) for s in series if s.legend]
    legend_items += [(b.label, b.colour, BAND) for b in bands[:1]]
    legend, legend_h = _legend(legend_items, left, 42, width - left - right)
    label_rows = 3 if markers else 0
    top = 30 + legend_h + label_rows * 14 + 8
    bottom = top + plot_height
    xd = nice_domain(min(xs), max(xs), 10) if min(xs) != max(xs) else (min(xs) - 1, max(xs) + 1)
    xd = (min(xd[0], min(xs)), max(xd[1], max(xs)))
    yd = y_domain or nice_domain(min(ys), max(ys), 5)
    sx = LinearScale(xd, (left, width - right))
    sy = LinearScale(yd, (bottom, top))
    out = _open_svg(width, bottom + 44, title, "line-chart") + legend
    out += _x_axis(sx, nice_ticks(*xd, 10), top, bottom, x_label)
    out += _y_axis(sy, nice_ticks(*yd, 5), left, width - right, y_label)
    for b in bands:
        x0, x1 = sx(b.x0), sx(b.x1)
        out.append(
            f'<rect class="band" x="{num(x0)}" y="{num(top)}" width="{num(max(x1 - x0, 1))}" '
            f'height="{num(plot_height)}" fill="{esc(b.colour)}" fill-opacity="0.13">'
            f"<title>{esc(b.label)}</title></rect>"
        )
    out += _markers(markers, sx, top, bottom, label_rows)
    for s in series:
        out += _series_path(s, sx, sy, yd)
    out.append(
        f'<rect x="{num(left)}" y="{num(top)}" width="{num(width - left - right)}" '
        f'height="{num(plot_height)}" fill="none" stroke="{GRID}"/></svg>'
    )
    return "".join(out)


def _markers(
    markers: Sequence[VMarker], sx: LinearScale, top: float, bottom: float, rows: int
) -> list[str]:
    xs = [sx(m.x) for m in markers]
    spans, flips = label_extents(xs, [m.label for m in markers], 11, sx.out[1])
    out = []
    for m, x, row, flip in zip(markers, xs, place_labels(spans, rows), flips, strict=True):
        dash = f' stroke-dasharray="{esc(m.dash)}"' if m.dash else ""
        tip = f"{m.label}: {m.detail}" if m.detail else m.label
        label, y_top = "", top
        if row is not None:
            y_text = top - 6 - (rows - 1 - row) * 14
            y_top = y_text + 3
            anchor = {"text_anchor": "end"} if flip else {}
            label = _text(
                x + (-3 if flip else 3), y_text, m.label, font_size=11, fill=m.colour, **anchor
            )
        out.append(
            f'<g class="marker"><title>{esc(tip)}</title><line x1="{num(x)}" y1="{num(y_top)}" '
            f'x2="{num(x)}" y2="{num(bottom)}" stroke="{esc(m.colour)}" stroke-width="1.5"{dash}/>'
            f"{label}</g>"
        )
    return out


def _series_path(s: Series, sx: LinearScale, sy: LinearScale, yd: tuple[float, float]) -> list[str]:
    parts, pinned, pen_down = [], [], False
    for x, y in s.points:
        if not math.isfinite(y):
            pinned.append((x, y, yd[1]))
            pen_down = False
            continue
        if y > yd[1] or y < yd[0]:
            pinned.append((x, y, min(max(y, yd[0]), yd[1])))
        yc = min(max(y, yd[0]), yd[1])
        parts.append(f"{'L' if pen_down else 'M'}{num(sx(x))} {num(sy(yc))}")
        pen_down = True
    dash = f' stroke-dasharray="{esc(s.dash)}"' if s.dash else ""
    out = [
        f'<g class="series" data-name="{esc(s.name)}"><title>{esc(s.name)}</title>'
        f'<path d="{" ".join(parts)}" fill="none" stroke="{esc(s.colour)}" '
        f'stroke-width="{num(s.width)}" stroke-opacity="{num(s.opacity)}" '
        f'stroke-linejoin="round"{dash}/>'
    ]
    for x, y, yc in pinned:
        px, py = sx(x), sy(yc) + (6 if yc == yd[1] else -6)
        shape = f"M{num(px - 5)} {num(py + 3)}L{num(px + 5)} {num(py + 3)}L{num(px)} {num(py - 5)}Z"
        out.append(
            f'<path class="off-scale" d="{shape}" fill="{esc(s.colour)}">'
            f"<title>{esc(s.name)}: step {fmt_tick(x)}, value {y:.4g} (off the scale)</title></path>"
        )
    out.append("</g>")
    return out


# -- heatmap ---------------------------------------------------------------------------------


def heatmap(
    values: Sequence[Sequence[float | None]],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str,
    x_label: str,
    y_label: str,
    unit: str,
    scale: ColourScale | None = None,
    outlined: frozenset[tuple[int, int]] = frozenset(),
    annotate: bool = False,
    width: float = 960,
    cell_height: float = 24,
) -> str:
    """Rows x columns of coloured cells, a colour bar, red outlines on `outlined` (row, col)."""
    if len(values) != len(row_labels) or any(len(r) != len(col_labels) for r in values):
        raise ValueError("heatmap values must be len(row_labels) rows of len(col_labels) cells")
    flat = [v for row in values for v in row if v is not None and math.isfinite(v)]
    scale = scale or ColourScale.for_values(flat)
    left = 16 + max((text_width(r, 12) for r in row_labels), default=0) + 24
    bar_w = 120
    top = 40
    grid_w = width - left - bar_w - 24
    cw = grid_w / max(len(col_labels), 1)
    if annotate:
        cell_height = max(cell_height, 40)
    height = top + cell_height * len(row_labels)
    out = _open_svg(width, height + 52 if col_labels else height + 20, title, "heatmap")
    for r, label in enumerate(row_labels):
        out.append(_text(left - 8, top + (r + 0.5) * cell_height + 4, label, text_anchor="end"))
    shown = labelled_columns(col_labels, max(1, int(grid_w // 44)))
    for c, label in enumerate(col_labels):
        if c in shown:
            out.append(
                _text(left + (c + 0.5) * cw, height + 16, label, text_anchor="middle", fill=MUTED)
            )
    out.append(_text(left + grid_w / 2, height + 38, x_label, text_anchor="middle", fill=MUTED))
    out.append(
        f'<text x="12" y="{num(top + (height - top) / 2)}" text-anchor="middle" fill="{MUTED}" '
        f'transform="rotate(-90 12 {num(top + (height - top) / 2)})">{esc(y_label)}</text>'
    )
    for r, row in enumerate(values):
        for c, v in enumerate(row):
            out.append(
                _cell(
                    left + c * cw,
                    top + r * cell_height,
                    cw,
                    cell_height,
                    v,
                    scale,
                    unit,
                    annotate,
                    f"{row_labels[r]}, {x_label} {col_labels[c]}",
                )
            )
    for r, c in sorted(outlined):
        out.append(
            f'<rect class="flagged" x="{num(left + c * cw + 1.5)}" y="{num(top + r * cell_height + 1.5)}" '
            f'width="{num(cw - 3)}" height="{num(cell_height - 3)}" fill="none" stroke="#d1242f" '
            f'stroke-width="3"/>'
        )
    out += _colour_bar(scale, width - bar_w + 8, top, min(height - top, 160), unit)
    out.append("</svg>")
    return "".join(out)


def labelled_columns(labels: Sequence[str], most: int) -> set[int]:
    """Which column labels to print: at most `most`; numeric labels at round values."""
    if len(labels) <= most:
        return set(range(len(labels)))
    if all(label.lstrip("-").isdigit() for label in labels):
        values = [int(label) for label in labels]
        step = max(1, round(nice_step(values[0], values[-1], most)))
        picked = [i for i, v in enumerate(values) if v % step == 0]
        keep, last = set(), -math.inf
        gap = len(labels) / most
        for i in picked:
            if i - last >= gap * 0.8:
                keep.add(i)
                last = i
        return keep
    every = math.ceil(len(labels) / most)
    return set(range(0, len(labels), every))


def _cell(
    x: float,
    y: float,
    w: float,
    h: float,
    v: float | None,
    scale: ColourScale,
    unit: str,
    annotate: bool,
    where: str,
) -> str:
    fill = scale.colour(v)
    shown = "no sample" if v is None or not math.isfinite(v) else f"{v:.3g} {unit}"
    mark = (
        f'<rect class="cell" x="{num(x)}" y="{num(y)}" width="{num(w + 0.3)}" height="{num(h - 1)}" '
        f'fill="{fill}"><title>{esc(where)}: {esc(shown)}</title></rect>'
    )
    if v is None:
        mark += (
            f'<line x1="{num(x + 1)}" y1="{num(y + h - 2)}" x2="{num(x + w - 1)}" y2="{num(y + 1)}" '
            f'stroke="#8c959f" stroke-width="1"/>'
        )
    if annotate and v is not None and math.isfinite(v):
        mark += _text(
            x + w / 2,
            y + h / 2 + 4,
            f"{v:.3g}",
            text_anchor="middle",
            fill=ink_on(fill),
            font_size=12,
        )
    return mark


def _colour_bar(scale: ColourScale, x: float, top: float, height: float, unit: str) -> list[str]:
    steps = 32
    out = [_text(x, top - 8, unit, fill=MUTED)]
    for i in range(steps):
        f = 1 - i / steps  # high values on top
        if scale.log:
            v = math.exp(math.log(scale.lo) + f * math.log(scale.hi / scale.lo))
        else:
            v = scale.lo + f * (scale.hi - scale.lo)
        out.append(
            f'<rect class="colour-bar" x="{num(x)}" y="{num(top + i * height / steps)}" width="14" '
            f'height="{num(height / steps + 0.5)}" fill="{scale.colour(v)}"/>'
        )
    for t in scale.ticks():
        y = top + (1 - scale.fraction(t)) * height
        out.append(
            f'<line x1="{num(x + 14)}" y1="{num(y)}" x2="{num(x + 18)}" y2="{num(y)}" stroke="{MUTED}"/>'
        )
        top_tick = scale.saturated and t == scale.ticks()[-1]
        out.append(_text(x + 21, y + 4, ("≥ " if top_tick else "") + fmt_tick(t), fill=MUTED))
    return out


# -- lane (timeline) chart -------------------------------------------------------------------


@dataclass(frozen=True)
class LaneEvent:
    """A point (`end` None) or a span on one lane of a timeline."""

    lane: str
    start: float
    end: float | None
    label: str
    colour: str
    detail: str = ""


def lane_chart(
    lanes: Sequence[str],
    events: Sequence[LaneEvent],
    *,
    title: str,
    x_label: str,
    width: float = 960,
    lane_height: float = 58,
) -> str:
    """One row per lane; points are diamonds, spans are bars; labels stack in up to 3 rows."""
    unknown = {e.lane for e in events} - set(lanes)
    if unknown:
        raise ValueError(f"events on unknown lanes: {', '.join(sorted(unknown))}")
    if not events:
        raise ValueError("a lane chart needs at least one event")
    left = 16 + max(text_width(lane, 12) for lane in lanes) + 16
    right, top = 24.0, 36.0
    ends = [e.end if e.end is not None else e.start for e in events]
    lo, hi = min(e.start for e in events), max(ends)
    xd = nice_domain(lo, hi, 8)
    sx = LinearScale(xd, (left, width - right))
    bottom = top + lane_height * len(lanes)
    out = _open_svg(width, bottom + 44, title, "lane-chart")
    out += _x_axis(sx, nice_ticks(*xd, 8), top, bottom, x_label)
    for i, lane in enumerate(lanes):
        y0 = top + i * lane_height
        if i % 2 == 0:
            out.append(
                f'<rect x="{num(left)}" y="{num(y0)}" width="{num(width - left - right)}" height="{num(lane_height)}" fill="#f6f8fa" fill-opacity="0.7"/>'
            )
        out.append(
            _text(left - 8, y0 + lane_height / 2 + 4, lane, text_anchor="end", font_weight="600")
        )
    for i, lane in enumerate(lanes):
        mine = sorted((e for e in events if e.lane == lane), key=lambda e: e.start)
        out += _lane_events(mine, sx, top + i * lane_height, lane_height)
    out.append("</svg>")
    return "".join(out)


def _lane_events(events: Sequence[LaneEvent], sx: LinearScale, y0: float, h: float) -> list[str]:
    base = y0 + h - 12
    xs = [sx(e.start) for e in events]
    spans, flip = label_extents(xs, [e.label for e in events], 11, sx.out[1])
    rows = place_labels(spans, 3, gap=8)
    out = []
    for e, row, f in zip(events, rows, flip, strict=True):
        x = sx(e.start)
        tip = f"{e.label} — {e.detail}" if e.detail else e.label
        if e.end is not None:
            mark = (
                f'<rect x="{num(x)}" y="{num(base - 6)}" width="{num(max(sx(e.end) - x, 2))}" '
                f'height="12" rx="3" fill="{esc(e.colour)}" fill-opacity="0.8"/>'
            )
        else:
            mark = (
                f'<path d="M{num(x)} {num(base - 7)}L{num(x + 7)} {num(base)}L{num(x)} {num(base + 7)}'
                f'L{num(x - 7)} {num(base)}Z" fill="{esc(e.colour)}" stroke="#ffffff"/>'
            )
        label = ""
        if row is not None:
            anchor = {"text_anchor": "end"} if f else {}
            label = _text(
                x + (4 if f else -4), base - 11 - row * 13, e.label, font_size=11, **anchor
            )
        out.append(f'<g class="event"><title>{esc(tip)}</title>{mark}{label}</g>')
    return out


# -- stacked bar -----------------------------------------------------------------------------


def stacked_bar(
    parts: Sequence[tuple[str, float, str]], *, title: str, unit: str = "s", width: float = 960
) -> str:
    """One horizontal bar split by category, with a legend giving value and share."""
    total = sum(max(v, 0.0) for _, v, _ in parts)
    if total <= 0:
        raise ValueError("a stacked bar needs a positive total")
    left, right, top, bar_h = 0.0, 0.0, 34.0, 34.0
    scale = LinearScale((0, total), (left, width - right))
    out = _open_svg(width, top + bar_h + 40, title, "stacked-bar")
    x, lx = left, left
    for label, value, colour in parts:
        w = scale(max(value, 0.0)) - left
        share = max(value, 0.0) / total
        tip = f"{label}: {value:.1f} {unit} ({share:.1%})"
        out.append(
            f'<rect class="segment" x="{num(x)}" y="{num(top)}" width="{num(w)}" height="{num(bar_h)}" '
            f'fill="{esc(colour)}"><title>{esc(tip)}</title></rect>'
        )
        inside = f"{share:.0%}"
        if w > text_width(inside, 12) + 8:
            out.append(
                _text(
                    x + w / 2,
                    top + bar_h / 2 + 4,
                    inside,
                    text_anchor="middle",
                    fill=ink_on(colour),
                    font_weight="600",
                )
            )
        item = f"{label} {value:.1f} {unit}"
        out.append(
            f'<rect x="{num(lx)}" y="{num(top + bar_h + 16)}" width="12" height="12" fill="{esc(colour)}"/>'
        )
        out.append(_text(lx + 16, top + bar_h + 26, item))
        lx += 16 + text_width(item, 12) + 22
        x += w
    out.append("</svg>")
    return "".join(out)
