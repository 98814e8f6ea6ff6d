"""The demo's HTML report and its SVG helpers, on a realistic synthetic demo."""

from __future__ import annotations

import dataclasses
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sentinel.demo import svg
from sentinel.demo.data import DemoData, RankSample, StepPoint, TimelineEntry
from sentinel.demo.figures import GOODPUT_PARTS, rank_matrix, rolled_back_from, straggler_note
from sentinel.demo.report import write_report

EVIL = "rank-5<script>alert(1)</script>"
VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "wbr", "source"}


def _loss(step: int) -> float:
    return 4.0 * math.exp(-step / 40) + 1.5


def make_data() -> DemoData:
    """Gen 0 runs steps 1-47, a fault at 45 is detected at 47, gen 1 resumes from checkpoint 40.
    Rank 5 is a straggler (1.3x), rank 6 hangs at step 100 (no samples after)."""
    steps = [StepPoint(s, _loss(s), 0, 0.5 * s) for s in range(1, 48)]
    steps += [StepPoint(s, _loss(s), 1, 40 + 0.5 * s) for s in range(41, 121)]
    steps[30] = StepPoint(31, 55.0, 0, 15.5)  # a loss spike far off the scale
    reference = [StepPoint(s, _loss(s), 0, 0.5 * s) for s in range(1, 121)]
    ranks = [
        RankSample(r, s, 0.5 * (1.3 if r == 5 else 1.0) + 0.001 * r, 0.31 if r != 5 else 0.24)
        for r in range(8)
        for s in range(1, 121)
        if not (r == 6 and s > 100)
    ]
    result = {
        "verdict": "pass",
        "scenario": "default",
        "completed_steps": 120,
        "incidents": [
            {
                "id": "inc-1",
                "kind": "ecc_dbe",
                "target": "node-2",
                "detected_step": 47,
                "actions": ["cordon node-2", "swap in spare-0", "rollback to step 40"],
                "resolution": "resolved",
            },
            {
                "id": "inc-2",
                "kind": "straggler",
                "target": EVIL,
                "detected_step": 33,
                "actions": [{"kind": "evict", "target": "node-2"}],
                "resolution": "resolved",
            },
        ],
        "faults": [
            {
                "kind": "ecc_dbe",
                "target": "node-2",
                "injected_step": 45,
                "detected": True,
                "detected_step": 47,
                "incident": "inc-1",
                "actions": ["cordon node-2"],
                "time_to_detect_s": 1.2,
                "time_to_resume_s": 21.5,
            },
            {
                "kind": "straggler",
                "target": EVIL,
                "injected_step": 30,
                "detected": True,
                "detected_step": 33,
                "incident": "inc-2",
                "actions": [],
                "time_to_detect_s": 4.0,
            },
            {
                "kind": "hang",
                "target": "rank-6",
                "injected_step": 100,
                "detected": False,
                "detected_step": None,
                "incident": None,
                "actions": [],
            },
        ],
        "false_incidents": [],
        "evicted_nodes": ["node-2"],
        "final_digest": "sha256:abc123",
        "reference_digest": "sha256:abc123",
        "bit_identical": True,
        "time_account": {
            "wall_s": 100.0,
            "seconds": {
                "productive": 80.0,
                "rollback": 5.0,
                "detection": 3.0,
                "repair": 12.0,
                "checkpoint": 0.0,
                "burnin": 0.0,
                "startup": 0.0,
            },
            "repair_stages_s": {
                "stop": 4.0,
                "relaunch": 3.0,
                "rendezvous": 1.0,
                "checkpoint_load": 2.0,
                "build": 2.0,
            },
            "effective_ratio": 0.8,
        },
    }
    nodes = {f"node-{i}": {"verdict": "pass", "reasons": []} for i in range(4)}
    nodes["node-3"] = {"verdict": "fail", "reasons": ["link node-3<->node-0: 0.25 GB/s"]}
    links = [
        {
            "a": f"node-{a}",
            "b": f"node-{b}",
            "gbps": 0.25 if 3 in (a, b) else 1.0,
            "verdict": "fail" if 3 in (a, b) else "pass",
        }
        for a in range(4)
        for b in range(a + 1, 4)
    ]
    burnin = {
        "verdict": "fail",
        "nodes": nodes,
        "links": links,
        "exclude": ["node-3"],
        "collectives": [
            {
                "op": "all_reduce",
                "bytes": 1 << 20,
                "algbw_gbps": 0.9,
                "busbw_gbps": 1.35,
                "correct": True,
            }
        ],
    }
    timeline = [
        TimelineEntry(1.0, None, "burnin", "node-3", "link node-3 slow: excluded"),
        TimelineEntry(15.0, 30, "fault", EVIL, "straggler injected"),
        TimelineEntry(16.5, 33, "detect", EVIL, "straggler detected"),
        TimelineEntry(22.5, 45, "fault", "node-2", "ecc_dbe injected"),
        TimelineEntry(23.7, 47, "incident", "node-2", "inc-1 opened"),
        TimelineEntry(24.0, None, "action", "node-2", "cordon node-2"),
        TimelineEntry(30.0, None, "action", "spare-0", "swap in spare-0"),
        TimelineEntry(45.2, 41, "resume", None, "resumed from step 40"),
    ]
    return DemoData(
        result,
        steps,
        reference,
        ranks,
        burnin,
        timeline,
        nodes_of_ranks={r: f"node-{r // 2}" for r in range(8)},
    )


class TreeCheck(HTMLParser):
    """Checks every opened tag is closed in order; collects tags with attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.errors: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> TreeCheck:
    tree = TreeCheck()
    tree.feed(html)
    tree.close()
    assert tree.errors == [] and tree.stack == [], (tree.errors, tree.stack)
    return tree


def section(html: str, ident: str) -> str:
    match = re.search(rf'<section id="{ident}">(.*?)</section>', html, re.S)
    assert match, f"no section {ident}"
    return match.group(1)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = write_report(tmp_path_factory.mktemp("out") / "nested", make_data())
    assert path.name == "report.html"
    return path.read_text(encoding="utf-8")


def test_page_is_well_formed_and_self_contained(full: str) -> None:
    tree = parse(full)
    names = {t for t, _ in tree.tags}
    assert "script" not in names and "link" not in names and "img" not in names
    assert not re.search(r'(src|href)="(https?:)?//', full)
    for ident in (
        "what-happened",
        "loss",
        "ranks",
        "burnin",
        "timeline",
        "correctness",
        "goodput",
        "how-to-read",
    ):
        section(full, ident)
    assert full.count("<svg ") == 6  # loss, step time, MFU, burn-in, timeline, goodput


def test_header_and_what_happened(full: str) -> None:
    assert 'class="verdict verdict-pass" id="verdict">pass<' in full
    assert (
        "3 fault(s) injected, 2 detected; 0 false incident(s); 120 steps completed; final parameters bit-identical"
        in full
    )
    table = section(full, "what-happened")
    assert table.split("<tbody>")[1].split("</tbody>")[0].count("<tr>") == 3
    assert "1.2 s" in table and "21.5 s" in table and '<span class="bad">missed</span>' in table
    assert "cordon node-2 → swap in spare-0 → rollback to step 40" in table
    assert "evict node-2" in table


def test_text_is_escaped(full: str) -> None:
    assert "<script>" not in full
    assert "rank-5&lt;script&gt;alert(1)&lt;/script&gt;" in full


def test_loss_chart_series_markers_and_bands(full: str) -> None:
    loss = section(full, "loss")
    names = re.findall(r'<g class="series" data-name="([^"]+)"', loss)
    assert names == [
        "clean reference run",
        "generation 0",
        "generation 1",
        "generation 0, rolled back",
    ]
    assert loss.count('class="marker"') == 5  # 3 faults + 2 incidents
    assert loss.count('class="band"') == 1
    assert loss.count('class="off-scale"') == 1  # the spike at step 31 is pinned, not scaled to


def test_rank_heatmaps_have_a_cell_per_rank_and_step(full: str) -> None:
    ranks = section(full, "ranks")
    step_svg, mfu_svg = ranks.split("<svg ")[1:3]
    assert step_svg.count('class="cell"') == 8 * 120
    assert step_svg.count("no sample") == 20  # rank 6 hangs after step 100
    assert "rank 5 · node-2" in step_svg
    assert mfu_svg.count('class="cell"') == 8 * 120 and "% MFU" in mfu_svg
    assert "rank 5 at 0.655 s, 1.30x the median" in ranks


def test_burnin_matrix_outlines_the_slow_node(full: str) -> None:
    burnin = section(full, "burnin")
    assert burnin.count('class="cell"') == 16
    assert burnin.count('class="flagged"') == 6  # node-3's three links, both directions
    assert burnin.count("no sample") == 4  # the diagonal was not measured
    flagged = burnin.split("Flagged nodes")[1]
    assert "node-3" in flagged and "0.25 GB/s" in flagged and "node-0</td>" not in flagged


def test_timeline_correctness_goodput(full: str) -> None:
    timeline = section(full, "timeline")
    assert timeline.count('class="event"') == 8 + 3  # entries + measured detect/resume bars
    for span in ("1.2 s to detect", "21.5 s to resume", "4.0 s to detect"):
        assert f">{span}</text>" in timeline
    for lane in ("Faults", "Detection", "Actions", "Resume", "Burn-in"):
        assert f">{lane}</text>" in timeline
    assert ">Info</text>" not in timeline
    correct = section(full, "correctness")
    assert "Bit-identical to the clean reference" in correct and correct.count("sha256:abc123") == 2
    goodput = section(full, "goodput")
    assert goodput.count('class="segment"') == len(GOODPUT_PARTS)
    assert ">80.0%<" in goodput and "repair: checkpoint load" in goodput


def test_missing_parts_say_not_available(tmp_path: Path) -> None:
    base = make_data()
    result = {k: v for k, v in base.result.items() if k not in ("time_account", "bit_identical")}
    result["false_incidents"] = [{"kind": "xid", "target": "node-1"}]
    result["verdict"] = "fail"
    ranks = [dataclasses.replace(s, mfu=None) for s in base.ranks]
    data = dataclasses.replace(base, result=result, ranks=ranks, burnin=None, timeline=[])
    html = write_report(tmp_path, data).read_text(encoding="utf-8")
    parse(html)
    assert 'verdict-fail" id="verdict">fail<' in html
    assert "Not available: no burn-in ran" in section(html, "burnin")
    assert "Not available: the ranks did not report MFU" in section(html, "ranks")
    assert "Not available: time accounting" in section(html, "goodput")
    assert "Not available: the run was not compared" in section(html, "correctness")
    assert "Not available: no timeline" in section(html, "timeline")
    assert "kind: xid, target: node-1" in section(html, "what-happened")
    empty = DemoData({}, [], [], [], None, [])
    html = write_report(tmp_path, empty).read_text(encoding="utf-8")
    parse(html)
    assert html.count('class="na"') == 8 and "<svg " not in html


def test_timeline_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="timeline kind 'oops'"):
        TimelineEntry(0.0, None, "oops", None, "x")


def test_rolled_back_and_rank_matrix_helpers() -> None:
    steps = [
        StepPoint(s, 1.0, g, 0.0)
        for g, rng in ((0, range(1, 30)), (1, range(20, 40)), (2, range(35, 50)))
        for s in rng
    ]
    assert rolled_back_from(steps) == {0: 20, 1: 35}
    samples = [RankSample(r, s, float(s), None) for r in (0, 1) for s in range(1, 451)]
    ranks, cols, matrix = rank_matrix(samples, "step_s")
    assert ranks == [0, 1] and len(cols) == 150 and cols[:2] == [1, 4]
    assert matrix[0][0] == 3.0  # a bin keeps its slowest step
    assert straggler_note(samples[:450]) is None


def test_scales_and_ticks() -> None:
    s = svg.LinearScale((0, 10), (100, 200))
    assert s(0) == 100 and s(5) == 150 and s(10) == 200
    assert svg.LinearScale((3, 3), (0, 10))(3) == 5
    assert svg.nice_ticks(0, 1, 5) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(1, 120, 10) == [20, 40, 60, 80, 100, 120]
    assert svg.nice_ticks(0.013, 0.049, 4) == [0.02, 0.03, 0.04]
    assert svg.nice_domain(1.53, 5.4) == (1.0, 6.0)
    assert svg.nice_domain(2.0, 2.0) == (1.8, 2.2)
    assert [svg.fmt_tick(v) for v in (0.30000000000000004, 25000, 3)] == ["0.3", "25k", "3"]


def test_colour_mapping() -> None:
    scale = svg.ColourScale(0.0, 1.0)
    assert scale.colour(0.0) == svg.VIRIDIS[0] and scale.colour(1.0) == svg.VIRIDIS[-1]
    assert scale.colour(2.0) == svg.VIRIDIS[-1] and scale.colour(None) == svg.MISSING
    assert scale.colour(float("nan")) == svg.MISSING
    assert svg.mix("#000000", "#ffffff", 0.5) == "#808080"
    log = svg.ColourScale(0.5, 60.0, log=True)
    assert log.fraction(0.5) == 0 and 0.0 < log.fraction(0.52) < 0.05 and log.fraction(60) == 1
    assert log.ticks() == [0.5, 1, 2, 5, 10, 20, 50]
    hang = svg.ColourScale.for_values([0.5] * 30 + [0.65] * 10 + [62.0])  # one hung step
    assert hang.saturated and hang.hi == 0.65 and hang.colour(62.0) == svg.VIRIDIS[-1]
    assert not svg.ColourScale.for_values([0.5, 0.65]).saturated
    assert svg.ink_on(svg.VIRIDIS[0]) == "#ffffff" and svg.ink_on(svg.VIRIDIS[-1]) == svg.INK
    with pytest.raises(ValueError, match="positive"):
        svg.ColourScale(0.0, 1.0, log=True)


def test_chart_helpers_escape_and_validate() -> None:
    chart = svg.line_chart(
        [svg.Series("a<b", [(0, 1.0), (1, float("nan")), (2, 3.0)], "#000")],
        title="t&t",
        x_label="x",
        y_label="y",
    )
    parse(chart)
    assert "a&lt;b" in chart and "t&amp;t" in chart
    assert chart.count(" M") == 1 and "off the scale" in chart  # NaN breaks the line, is flagged
    with pytest.raises(ValueError, match="finite"):
        svg.line_chart([svg.Series("a", [], "#000")], title="t", x_label="x", y_label="y")
    with pytest.raises(ValueError, match="rows"):
        svg.heatmap([[1.0]], ["a", "b"], ["c"], title="t", x_label="x", y_label="y", unit="s")
    with pytest.raises(ValueError, match="unknown lanes"):
        svg.lane_chart(["A"], [svg.LaneEvent("B", 0, None, "x", "#000")], title="t", x_label="s")
    assert svg.labelled_columns([str(s) for s in range(1, 121)], 12) == {
        i - 1 for i in range(10, 121, 10)
    }
    assert svg.labelled_columns(["a", "b", "c", "d"], 2) == {0, 2}
    spans, flips = svg.label_extents([10, 95], ["abc", "abc"], 10, 100)
    assert flips == [False, True] and spans[1][1] == 99 and spans[0][0] == 6
    assert svg.place_labels([(0, 50), (10, 60), (20, 70), (100, 120)], 2) == [0, 1, None, 0]


def test_partial_inputs_degrade_to_notes(tmp_path: Path) -> None:
    base = make_data()
    burnin = {
        "verdict": "pass",
        "nodes": {},
        "links": [{"a": "node-0", "b": "node-1", "gbps": None}],
    }
    nan_steps = [StepPoint(1, float("nan"), 0, 0.0)]
    data = dataclasses.replace(base, steps=nan_steps, reference_steps=[], burnin=burnin)
    html = write_report(tmp_path, data).read_text(encoding="utf-8")
    parse(html)
    assert "Not available: the burn-in report has no measured link bandwidths" in html
    assert "Not available: no training steps were recorded" in section(html, "loss")
    one_gen = [p for p in base.steps if p.generation == 1]
    html = write_report(tmp_path, dataclasses.replace(base, steps=one_gen)).read_text("utf-8")
    loss = section(html, "loss")
    assert 'class="band"' not in loss and loss.count('<g class="series"') == 2
