"""The demo's HTML report on a realistic synthetic demo: what a reader sees in each section
and figure (the figures' text is text in their SVG, and each has a caption saying what it
shows). `test_demo_report_browser.py` renders the same page in a real browser."""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from demo_report_data import make_data

from sentinel.lab.demo.data import DemoData, RankSample, StepPoint, TimelineEntry
from sentinel.lab.demo.drill import rank_samples
from sentinel.lab.demo.figures import loss_chart, loss_top
from sentinel.lab.demo.lanes import Span, labelled_bars, repair_spans
from sentinel.lab.demo.plot import place_labels
from sentinel.lab.demo.rankmap import (
    blocks,
    colour_norm,
    describe,
    hold_until_next_report,
    node_of,
    rank_heatmap,
    report_stride,
)
from sentinel.lab.demo.readings import GOODPUT_PARTS, rolled_back_from, straggler_note
from sentinel.lab.demo.report import write_report
from sentinel.lab.demo.result import Generation, goodput_input
from sentinel.lab.goodput.drill_projection import drill_projection

VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "wbr", "source"}


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


def figure(html: str, ident: str) -> tuple[str, str]:
    """A figure's SVG text (labels, legends, ticks: what a reader sees) and its caption."""
    match = re.search(rf'<figure id="fig-{ident}">(.*?)</figure>', html, re.S)
    assert match, f"no figure {ident}"
    drawn = re.search(r"<svg .*</svg>", match.group(1), re.S)
    assert drawn, f"figure {ident} has no SVG"
    parse(match.group(1))
    # What is drawn: without the chart's own name and description, or its style sheet.
    tree = parse(re.sub(r"<title .*?</desc>|<style.*?</style>", "", drawn.group(0), flags=re.S))
    caption = re.search(r"<figcaption>(.*?)</figcaption>", match.group(1), re.S)
    assert caption and len(caption.group(1)) > 40, f"figure {ident} has no caption"
    return " ".join(t.strip() for t in tree.text if t.strip()), unescape(caption.group(1))


FIGURES = ("loss", "rank-step-time", "rank-mfu", "burnin-links", "timeline", "goodput")


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
    assert full.count("<svg ") == 6 and full.count("<figure ") == 6
    for ident in FIGURES:
        figure(full, ident)


def test_figures_are_named_and_their_ids_do_not_clash(full: str) -> None:
    """Six inline SVGs share one document: every id is unique and every reference (clip
    paths, reused glyphs, rasterised cells) points at an id of the page. Each chart is an
    image with a title and a description for assistive technology."""
    ids = re.findall(r'\bid="([^"]+)"', full)
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1][:5]
    refs = re.findall(r"url\(#([^)]+)\)", full) + re.findall(r'href="#([^"]+)"', full)
    assert refs and set(refs) <= set(ids)
    for ident in FIGURES:
        head = re.search(rf'<svg [^>]*data-chart="{ident}"[^>]*>', full)
        assert head and 'role="img"' in head.group(0)
        assert f'aria-labelledby="{ident}-title {ident}-desc"' in head.group(0)
        assert f'<title id="{ident}-title">' in full and f'<desc id="{ident}-desc">' in full


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
    stages = table.split('id="repair-stages"')[1]
    rows = stages.split("<tbody>")[1].split("</tbody>")[0]
    assert rows.count("<tr>") == 1  # inc-2 relaunched nothing
    assert "<td>inc-1</td>" in rows and ">41.2<" in rows and ">47.0<" in rows
    assert ">10.0 s<" in rows  # detection to the first step


def test_text_is_escaped(full: str) -> None:
    assert "<script>" not in full
    assert "rank-5&lt;script&gt;alert(1)&lt;/script&gt;" in full


def test_loss_chart_shows_generations_rollbacks_markers_and_the_spike(full: str) -> None:
    text, caption = figure(section(full, "loss"), "loss")
    for name in ("clean reference run", "generation 0", "generation 1", "generation 2"):
        assert name in text
    assert "generation 0, rolled back" in text and "generation 1, rolled back" in text
    assert "rolled back, then replayed" in text
    assert "✕ ecc_dbe" in text and "⚑ ecc_dbe" in text and "✕ hang" in text
    assert "55 off scale" in text  # the spike at step 31 is pinned to the top, not scaled to
    assert "Generation 0 trained steps 41-47, then they were rolled back" in caption
    assert "Generation 1 trained steps 101-103, then they were rolled back" in caption
    assert "ecc_dbe at step 45" in caption and "Off the scale: step 31 (55)" in caption


def test_rank_heatmaps_label_where_each_rank_actually_ran(full: str) -> None:
    """Rank 6 was planned for node-3, which burn-in excluded: it ran on spare-0. Ranks 4-5
    moved from node-2 to spare-1 after the ECC error. Every generation's rows are there."""
    ranks = section(full, "ranks")
    text, caption = figure(ranks, "rank-step-time")
    assert "node-3" not in ranks
    assert "g0 · rank 6 · spare-0" in text and "g2 · rank 7 · spare-0" in text
    assert "g0 · rank 4 · node-2" in text and "g1 · rank 4 · spare-1" in text
    assert sum(f"· rank {r} ·" in text for r in range(8)) == 8
    assert text.count("· rank 5 ·") == 3  # one row per generation
    assert "Generation 0 on node-0, node-1, node-2, spare-0 trained steps 1-47" in caption
    assert "Generation 1 on node-0, node-1, spare-1, spare-0 trained steps 41-103" in caption


def test_rank_heatmaps_show_lost_work_the_hang_and_the_checkpoints(full: str) -> None:
    ranks = section(full, "ranks")
    for ident in ("rank-step-time", "rank-mfu"):
        text, caption = figure(ranks, ident)
        assert "of which 41-47 were rolled back" in caption
        assert "of which 101-103 were rolled back" in caption
        # The hung step never reports: it is drawn as the step each rank was in when stopped.
        assert "step 104 never finished (no report in the 41.1 s before the next launch)" in caption
        assert "✕ step 48 unfinished" in text and "✕ step 104 unfinished" in text
        assert (
            "trained, then rolled back" in text and "unfinished when its generation stopped" in text
        )
        assert all(f"ckpt {c}" in text for c in (20, 40, 60, 80, 100))
        assert "Checkpoints saved after steps 20, 40, 60, 80, 100, 120" in caption
    assert "% MFU" in figure(ranks, "rank-mfu")[0]
    assert "rank 5 at 0.655 s, 1.30x the median" in ranks


def test_burnin_matrix_outlines_the_slow_node(full: str) -> None:
    burnin = section(full, "burnin")
    text, caption = figure(burnin, "burnin-links")
    assert text.count("0.25") == 6 and text.count("—") == 4  # the diagonal was not measured
    assert (
        "Failed links (outlined in red): node-0<->node-3, node-1<->node-3, node-2<->node-3"
        in caption
    )
    flagged = burnin.split("Flagged nodes")[1]
    assert "node-3" in flagged and "0.25 GB/s" in flagged and "node-0</td>" not in flagged


def test_timeline_correctness_goodput(full: str) -> None:
    text, caption = figure(section(full, "timeline"), "timeline")
    for span in ("1.2 s to detect", "21.5 s to resume", "4.0 s to detect"):
        assert span in text and span in caption
    for lane in ("Faults", "Detection", "Actions", "Resume", "Burn-in"):
        assert lane in text
    assert "Info" not in text
    assert "8 timeline entries over 45 s" in caption
    assert section(full, "timeline").count("<tr>") == 1 + 8  # the table has every entry
    correct = section(full, "correctness")
    assert "Bit-identical to the clean reference" in correct and correct.count("sha256:abc123") == 2
    goodput = section(full, "goodput")
    text, caption = figure(goodput, "goodput")
    assert all(label in text for _k, label, _c in GOODPUT_PARTS)
    assert "productive steps 80.0 s (80%)" in caption and "repair 12.0 s (12%)" in caption
    assert ">80.0%<" in goodput and "repair: checkpoint load" in goodput


def test_goodput_shows_where_the_fleet_projections_gain_comes_from(tmp_path: Path) -> None:
    """The drill's times on Llama 3's fleet, decomposed lever by lever under the run's account."""
    base = make_data()
    times = goodput_input(base.result)
    projection = drill_projection(times, "out/goodput.json")
    data = dataclasses.replace(base, result={**base.result, "fleet_projection": projection})
    html = write_report(tmp_path, data).read_text(encoding="utf-8")
    parse(html)
    goodput = section(html, "goodput")
    assert 'id="goodput-ratio"' in goodput  # the run's own account stays first
    shown = unescape(re.sub(r"<[^>]+>", " ", goodput.split('id="goodput-decomposition"')[1]))
    rows = projection["decomposition"]
    labels = ["baseline (no Sentinel): ", *(f"+ {r['lever']}: " for r in rows[1:]), "= Sentinel"]
    at = [shown.index(label) for label in labels]
    assert at == sorted(at)
    assert f"{100 * rows[-1]['ratio_mean']:.2f}%" in shown
    assert f"{100 * sum(r['gain'] for r in rows):+.2f} points" in shown
    assert "this drill's detection and resume times where it timed a fault class (node)" in shown
    assert "sentinel goodput --from-demo out/goodput.json" in shown
    # A run recorded before the projection: its account, and the projection not available.
    html = write_report(tmp_path, base).read_text(encoding="utf-8")
    assert "Not available: the fleet projection" in section(html, "goodput")


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


def test_without_matplotlib_each_figure_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Matplotlib is the demo's extra: without it the page still holds everything else."""
    for module in (
        "sentinel.lab.demo.figures",
        "sentinel.lab.demo.rankmap",
        "sentinel.lab.demo.lanes",
    ):
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    html = write_report(tmp_path, make_data()).read_text(encoding="utf-8")
    parse(html)
    assert "<svg " not in html and html.count("pip install &#x27;sentinel[demo]&#x27;") == 6
    assert "rank 5 at 0.655 s" in html and ">80.0%<" in html


def test_timeline_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="timeline kind 'oops'"):
        TimelineEntry(0.0, None, "oops", None, "x")


def test_rolled_back_steps_and_the_straggler_note() -> None:
    pairs = [
        (g, s)
        for g, rng in ((0, range(1, 30)), (1, range(20, 40)), (2, range(35, 50)))
        for s in rng
    ]
    assert rolled_back_from(pairs) == {0: 20, 1: 35}
    samples = [RankSample(r, s, float(s), None) for r in (0, 1) for s in range(1, 451)]
    assert straggler_note(samples[:450]) is None  # one rank: nobody to compare it with
    assert "rank 1 at" not in (straggler_note(samples) or "rank 1 at")


def test_generation_blocks_keep_lost_work_and_the_unfinished_step() -> None:
    """Two samples of step 12 on rank 0 (lost, then replayed) both stay; the step after each
    rank's last report in a stopped generation is unfinished, with how long it went silent."""
    gens = [Generation(0.0, 0, ("node-0",)), Generation(30.0, 1, ("spare-0",))]
    samples = [RankSample(r, s, 1.0 + s, None, 0, 2.0 * s) for r in (0, 1) for s in range(1, 14)]
    samples = [x for x in samples if not (x.rank == 1 and x.step == 13)]  # rank 1 stuck in 13
    samples += [RankSample(r, s, 2.0, None, 1, 40.0 + s) for r in (0, 1) for s in range(11, 21)]
    first, second = blocks(samples, gens, "step_s", finished=True)
    assert first.values[(0, 12)] == 13.0 and second.values[(0, 12)] == 2.0
    assert first.lost_from == 11 and second.lost_from is None
    assert first.unfinished == {0: 14, 1: 13} and second.unfinished == {}
    assert first.stopped_for_s == pytest.approx(30.0 - 26.0)
    assert [node_of(first.nodes, r, 2) for r in (0, 1, 2)] == ["node-0", "node-0", None]
    cut_short = [x for x in samples if x.generation == 0 and x.step <= 3 - x.rank]
    (unfinished_run,) = blocks(cut_short, gens[:1], "step_s", finished=False)
    assert unfinished_run.unfinished == {0: 4, 1: 3} and unfinished_run.stopped_for_s is None
    text = describe([first, second], 2, [10], "Step time")
    assert "Generation 0 on node-0 trained steps 1-13, of which 11-13 were rolled back" in text
    assert "step 13, 14 never finished (no report in the 4.0 s before the next launch)" in text
    # the supervisor's teardown record says when the gang was gone: the relaunch is from there
    stopped = [Generation(0.0, 0, ("node-0",), stopped_t=27.5), gens[1]]
    first, _ = blocks(samples, stopped, "step_s", finished=True)
    assert first.relaunch_s == pytest.approx(2.5)
    text = describe([first], 2, [], "Step time")
    assert "before the next launch, which came 2.5 s after the gang was stopped)" in text


def test_a_generations_stop_is_read_from_the_supervisors_teardown(tmp_path: Path) -> None:
    from sentinel.lab.demo.drill import generations

    log = tmp_path / "supervisor.log"
    records = [
        {"ts": 100.0, "msg": "launching generation 0", "generation": 0, "nodes": ["node-0"]},
        {"ts": 120.5, "msg": "gang of generation 0 gone", "teardown": {"generation": 0}},
        {"ts": 121.0, "msg": "launching generation 1", "generation": 1, "nodes": ["spare-0"]},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert generations(log, 100.0) == [
        Generation(0.0, 0, ("node-0",), stopped_t=20.5),
        Generation(21.0, 1, ("spare-0",)),
    ]


def test_ranks_reporting_every_few_steps_stop_where_the_metrics_do() -> None:
    """With a report every 2 steps (the drills' compressed default), the step in progress when
    a generation stopped comes from the trainer's metrics, which close every step."""
    gens = [Generation(0.0, 0, ("node-0",)), Generation(30.0, 1, ("spare-0",))]
    samples = [RankSample(r, s, 1.0, None, 0, float(s)) for r in (0, 1) for s in range(1, 15, 2)]
    samples += [RankSample(r, s, 1.0, None, 1, 40.0 + s) for r in (0, 1) for s in range(11, 21, 2)]
    metrics = [StepPoint(s, 1.0, 0, 0.0) for s in range(1, 15)]
    metrics += [StepPoint(s, 1.0, 1, 0.0) for s in range(11, 21)]
    first, _second = blocks(samples, gens, "step_s", True, metrics)
    assert first.unfinished == {0: 15, 1: 15} and first.lost_from == 11
    assert report_stride(samples) == 2 and report_stride(samples[:1]) == 1
    row = np.array([np.nan, 1.0, np.nan, np.nan, 4.0, np.nan])
    # inside the reported range only: no sample stays no sample
    hold_until_next_report(row, [1, 2, 3, 4, 5, 6], stride=3)
    assert np.array_equal(row, [np.nan, 1.0, 4.0, 4.0, 4.0, np.nan], equal_nan=True)
    # a replica healed from a live peer: its first step (2), then its peers' (40); a report
    # covers the stride up to it, and the steps it never ran stay empty
    row = np.array([1.0, np.nan, np.nan, np.nan, 4.0])
    hold_until_next_report(row, [2, 3, 20, 39, 40], stride=2)
    assert np.array_equal(row, [1.0, np.nan, np.nan, 4.0, 4.0], equal_nan=True)
    chart = rank_heatmap(samples, gens, 1, [], "step_s", True, metrics)
    assert "step 15 never finished" in chart.caption
    assert "Ranks report every 2 steps" in chart.caption


def test_colour_scales_are_not_flattened_by_a_stall() -> None:
    norm, extend = colour_norm([0.5] * 30 + [0.65] * 10 + [62.0], "step_s")  # one hung step
    assert extend == "max" and norm.vmax == pytest.approx(1.5) and norm.vmin == 0.5
    norm, extend = colour_norm([0.5, 0.65], "step_s")
    assert extend == "neither" and (norm.vmin, norm.vmax) == (0.5, 0.65)
    norm, extend = colour_norm([30.0] * 9 + [1.0], "mfu")
    assert extend == "min" and norm.vmin == pytest.approx(10.0)
    assert loss_top([4.0, 3.0, 2.0] * 30 + [55.0]) is not None
    assert loss_top([4.0, 3.0, 2.0]) is None and loss_top([float("nan")]) is None


def test_timeline_labels_never_overlap() -> None:
    xs = [0.0, 0.5, 1.0, 1.5, 50.0]
    levels = place_labels(xs, ["a long label of twenty"] * 5, span=100.0, width_in=10.0, levels=3)
    assert levels == [0, 1, 2, None, 0]  # the fourth has no room: the table lists it


def test_bar_labels_never_overlap() -> None:
    """The default drill's faults follow each other within seconds: a bar whose label would run
    into the one before it on its lane is drawn without it (the caption names them all)."""
    starts = [48.8, 61.2, 62.0, 63.9, 65.1, 70.0, 90.0]
    spans = [Span("Detection", t, t + 0.3, "0.3 s to detect", "#c8b6f2") for t in starts]
    spans.append(Span("Resume", 49.1, 51.0, "1.9 s to resume", "#9fd8c0"))
    drawn = labelled_bars(spans, span_s=130.0)
    # a label is ~18 s wide on a 130 s chart: the next one fits only past its end
    assert [s.start for s in drawn if s.lane == "Detection"] == [48.8, 70.0, 90.0]
    assert [s.lane for s in drawn].count("Resume") == 1  # another lane is its own row


def test_rank_samples_keep_every_generation(tmp_path: Path) -> None:
    """From a coordinator store: the hooks' step s is the trainer's s + 1, and a replayed
    step's report sits beside the lost one, each in the generation launched before it."""
    db = tmp_path / "coordinator.db"
    conn = sqlite3.connect(db)
    conn.execute(
        "CREATE TABLE events (id TEXT PRIMARY KEY, kind TEXT NOT NULL, node TEXT, rank INTEGER,"
        " job TEXT, ts REAL NOT NULL, payload TEXT NOT NULL, received_at REAL NOT NULL,"
        " incident_id INTEGER)"
    )
    rows = [(0, 1005.0, 10, 1.5), (0, 1006.0, 11, 1.6), (0, 1050.0, 10, 2.5), (1, 1051.0, 10, 2.4)]
    for i, (rank, ts, step, step_s) in enumerate(rows):
        payload = json.dumps({"step": step, "step_s": step_s, "mfu": 0.3})
        conn.execute(
            "INSERT INTO events VALUES (?, 'rank.step', 'node-0', ?, 'j', ?, ?, ?, NULL)",
            (str(i), rank, ts, payload, ts),
        )
    conn.execute(
        "INSERT INTO events VALUES ('x', 'gpu.sample', 'node-0', NULL, 'j', 1, '{}', 1, NULL)"
    )
    conn.commit()
    conn.close()
    gens = [Generation(0.0, 0, ("node-0",)), Generation(40.0, 1, ("spare-0",))]
    got = rank_samples(db, 1000.0, gens)
    assert [(s.generation, s.rank, s.step, s.step_s) for s in got] == [
        (0, 0, 11, 1.5),
        (0, 0, 12, 1.6),
        (1, 0, 11, 2.5),
        (1, 1, 11, 2.4),
    ]
    assert got[0].t == 5.0 and got[0].mfu == 0.3
    assert rank_samples(tmp_path / "absent.db", 0.0, gens) == []


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
    loss = loss_chart(one_gen, base.reference_steps, base.result)
    assert "rolled back" not in loss.svg and "rolled back" not in loss.caption
    assert "generation 1" in loss.svg and "generation 0" not in loss.svg
    # Ranks reported before any generation was known are still drawn, without a node.
    ranks = rank_heatmap(base.ranks, [], 2, [], "step_s")
    assert "g1 · rank 4" in ranks.svg and "spare-" not in ranks.svg and "node-" not in ranks.svg


def test_every_fault_gets_its_bars_wherever_it_struck() -> None:
    """A rank's fault strikes on a node and a corrupt batch on none: each injection is found by
    its `fault:INDEX`, not by a target the result names otherwise (`rank-3`, `batch-45`)."""
    entries = [
        TimelineEntry(10.0, 5, "fault", "node-1", "crash on rank-3", ref="fault:0"),
        TimelineEntry(12.0, 7, "fault", None, "corrupt batch 45", ref="fault:1"),
    ]
    faults = [
        {"kind": "crash", "target": "rank-3", "time_to_detect_s": 0.5, "time_to_resume_s": 1.0},
        {"kind": "corrupt_batch", "target": "batch-45", "time_to_detect_s": 0.25},
    ]
    spans = repair_spans(entries, faults, ["Detection", "Resume"])
    assert [(s.lane, s.start, s.end) for s in spans] == [
        ("Detection", 10.0, 10.5),
        ("Resume", 10.5, 11.5),
        ("Detection", 12.0, 12.25),
    ]
