"""The demo report in a real browser: headless Chromium (the distribution's `chromium`) loads
the page from disk, lays it out and paints it.

Two runs of the browser, neither through the DevTools protocol:
- `--dump-dom` on a copy of the page with a measuring script added (the report itself has no
  script): each figure's size on the page, the size of what its SVG draws, and any embedded
  raster (a heatmap's cells) that fails to load;
- `--screenshot` of the report itself, full height: each figure's area must hold a picture,
  not a blank box.
Both runs log the page's console to stderr (`--enable-logging=stderr`); any message fails the
test, since a page without scripts only logs when the browser rejects something in it (an SVG
attribute it cannot parse, for one).

Without Chromium the tests fail with the command that installs it (scripts/system-packages.txt).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from demo_report_data import make_data
from PIL import Image
from system_deps import require_command

from sentinel.lab.demo.report import write_report

pytestmark = pytest.mark.slow
FIGURES = {
    "fig-loss",
    "fig-rank-step-time",
    "fig-rank-mfu",
    "fig-burnin-links",
    "fig-timeline",
    "fig-goodput",
}
WIDTH = 1200
# In the copy's <head>: images that fail are seen as they fail (capture phase), and the page
# is measured once it has loaded, every image with it, so the dump always holds the answer.
MEASURE = """<script>
const failed = [];
document.addEventListener("error", (e) => {
  const fig = e.target.closest ? e.target.closest("figure") : null;
  failed.push(fig ? fig.id : String(e.target.tagName));
}, true);
window.addEventListener("load", () => {
  const out = {height: document.documentElement.scrollHeight, figures: [], failed: failed};
  for (const fig of document.querySelectorAll("figure")) {
    const svg = fig.querySelector("svg");
    const r = svg ? svg.getBoundingClientRect() : {x: 0, y: 0, width: 0, height: 0};
    const drawn = svg ? svg.getBBox() : {width: 0, height: 0};
    out.figures.push({id: fig.id, x: r.x + scrollX, y: r.y + scrollY, width: r.width,
                      height: r.height, drawn: [drawn.width, drawn.height],
                      images: svg ? svg.querySelectorAll("image").length : 0});
  }
  document.body.setAttribute("data-measured", JSON.stringify(out));
});
</script>"""


@dataclass
class Seen:
    figures: list[dict[str, Any]]
    height: int
    failed: list[str]  # the figures (or elements) holding a resource that failed to load
    console: list[str]


def chromium(page: Path, profile: Path, *args: str) -> tuple[str, list[str]]:
    """Run the browser once on `page`; its stdout and the page's console messages."""
    cmd = [
        require_command("chromium", "chromium"),
        "--headless",
        "--no-sandbox",  # as root (CI) Chromium refuses its sandbox
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def measure(report: Path, tmp: Path) -> Seen:
    """Lay the page out in the browser and measure every figure (a copy with a script)."""
    copy = tmp / "measured.html"
    copy.write_text(report.read_text("utf-8").replace("<head>", "<head>" + MEASURE, 1), "utf-8")
    dom, console = chromium(
        copy,
        tmp / "profile-measure",
        "--dump-dom",
        "--virtual-time-budget=20000",
        f"--window-size={WIDTH},900",
    )
    found = re.search(r'data-measured="([^"]*)"', dom)
    assert found, "the measuring script did not finish: " + dom[-500:]
    out = json.loads(unescape(found.group(1)))
    return Seen(out["figures"], int(out["height"]), out["failed"], console)


def layout_problems(seen: Seen) -> list[str]:
    """Figures missing from the page, laid out with no size, drawing nothing, or holding a
    raster the browser cannot decode."""
    problems = [f"missing figure {f}" for f in sorted(FIGURES - {f["id"] for f in seen.figures})]
    for f in seen.figures:
        if f["width"] < 300 or f["height"] < 80:
            problems.append(f"{f['id']} is laid out {f['width']:.0f}x{f['height']:.0f} px")
        if min(f["drawn"]) <= 0:
            problems.append(f"{f['id']} draws nothing")
    problems += [f"{where} holds an image the browser cannot load" for where in seen.failed]
    return problems


def pixel_problems(png: Path, seen: Seen) -> list[str]:
    """Each figure's area of the screenshot must be a picture: many colours, much ink."""
    problems = []
    with Image.open(png) as shot:
        image = shot.convert("RGB")
    for f in seen.figures:
        box = (int(f["x"]), int(f["y"]), int(f["x"] + f["width"]), int(f["y"] + f["height"]))
        area = image.crop(box)
        colours = area.getcolors(1 << 20) or []
        ink = sum(n for n, c in colours if c != (255, 255, 255)) / max(1, area.width * area.height)
        if len(colours) < 16 or ink < 0.03:
            problems.append(f"{f['id']} is blank on screen ({len(colours)} colours, {ink:.1%} ink)")
    return problems


def test_the_report_renders_every_figure_in_chromium(tmp_path: Path) -> None:
    report = write_report(tmp_path / "out", make_data())
    seen = measure(report, tmp_path)
    assert layout_problems(seen) == []
    assert {f["id"] for f in seen.figures} == FIGURES
    assert sum(f["images"] for f in seen.figures) >= 2  # the heatmaps' rasterised cells
    png = tmp_path / "report.png"
    _, console = chromium(
        report,
        tmp_path / "profile-shot",
        f"--screenshot={png}",
        f"--window-size={WIDTH},{seen.height}",
    )
    assert seen.console == [] and console == [], seen.console + console
    with Image.open(png) as shot:
        assert shot.size == (WIDTH, seen.height)
    assert pixel_problems(png, seen) == []
    print(f"screenshot: {png}")


def test_a_broken_figure_is_caught(tmp_path: Path) -> None:
    """The checks fail on what they are for: a figure emptied, a raster that cannot decode and
    an SVG attribute the browser rejects (the console says so)."""
    report = write_report(tmp_path / "out", make_data())
    html = report.read_text("utf-8")
    html = re.sub(r'(<svg [^>]*data-chart="goodput"[^>]*>).*?</svg>', r"\1</svg>", html, flags=re.S)
    html = re.sub(
        r'href="data:image/png;base64,[^"]{40}', 'href="data:image/png;base64,AAAA', html, count=1
    )
    html = re.sub(r'<path d="[^"]*"', '<path d="M 0 0 L x y"', html, count=1)
    broken = tmp_path / "broken.html"
    broken.write_text(html, "utf-8")
    seen = measure(broken, tmp_path)
    problems = layout_problems(seen)
    assert "fig-goodput draws nothing" in problems
    assert "fig-rank-step-time holds an image the browser cannot load" in problems
    assert any("attribute d: Expected number" in line for line in seen.console), seen.console
