"""Where the goodput headline's gain comes from: the baseline turned into Sentinel one lever at a
time, each row simulated in full on the same failures, ending exactly at Sentinel's projection."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from sentinel.cli import main
from sentinel.lab.goodput import drill_projection
from sentinel.lab.goodput.compare import rule_spares
from sentinel.lab.goodput.decompose import (
    LABELS,
    LEVERS,
    decompose,
    decomposition_dict,
    render_decomposition,
)
from sentinel.lab.goodput.inputs import Plan, build_models, default_rows
from sentinel.lab.goodput.measurements import read_measurements
from sentinel.lab.goodput.model import RecoveryModel
from sentinel.lab.goodput.paths import Recovery
from sentinel.lab.goodput.simulate import Fleet
from sentinel.lab.goodput.trace import LLAMA3

ORDER = ["baseline", "checkpoint interval", "hot spares", "detection", "repair"]


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet(LLAMA3, gpus=16384, days=54, seeds=[0, 1, 2])


def _models(recovery: Recovery = Recovery.CATALOG) -> tuple[RecoveryModel, RecoveryModel]:
    """The headline's Sentinel and baseline models, from the shipped inputs."""
    measurements, where = read_measurements()
    values = {r.key: r.value for r in default_rows(measurements, where)}
    plan = Plan(16384, rule_spares(LLAMA3, 16384, values), None, True, recovery)
    sentinel, baseline, _spec = build_models(values, plan)
    return sentinel, baseline


def _changed(a: RecoveryModel, b: RecoveryModel) -> set[str]:
    fields = dataclasses.fields(RecoveryModel)
    return {f.name for f in fields if getattr(a, f.name) != getattr(b, f.name)} - LABELS


@pytest.mark.parametrize("recovery", [Recovery.CATALOG, Recovery.RESTART])
def test_the_rows_run_from_the_baseline_to_sentinel(fleet: Fleet, recovery: Recovery) -> None:
    sentinel, baseline = _models(recovery)
    steps = decompose(fleet, baseline, sentinel)
    assert [s.lever for s in steps] == ORDER
    assert steps[0].summary.ratios == fleet.evaluate(baseline).ratios
    # The last row is Sentinel's projection, run for run: the same model on the same failures.
    assert steps[-1].summary.ratios == fleet.evaluate(sentinel).ratios
    assert _changed(steps[-1].summary.model, sentinel) == set()


def test_each_row_turns_its_lever_and_nothing_else(fleet: Fleet) -> None:
    sentinel, baseline = _models()
    steps = decompose(fleet, baseline, sentinel)
    for (before, after), lever in zip(itertools.pairwise(steps), LEVERS, strict=True):
        assert after.lever == lever.name
        assert _changed(before.summary.model, after.summary.model) == set(lever.fields)
        assert after.gain == after.summary.mean - before.summary.mean


def test_the_gains_add_up_to_sentinel_less_the_baseline(fleet: Fleet) -> None:
    sentinel, baseline = _models()
    steps = decompose(fleet, baseline, sentinel)
    total = fleet.evaluate(sentinel).mean - fleet.evaluate(baseline).mean
    assert steps[0].gain == 0.0
    assert sum(s.gain for s in steps) == pytest.approx(total, abs=1e-12)
    # On Llama 3's failures every lever pays: none of the four rows is a loss.
    assert all(s.gain > 0 for s in steps[1:])


def test_a_difference_no_lever_names_is_refused(fleet: Fleet) -> None:
    sentinel, baseline = _models()
    with pytest.raises(ValueError, match="manual_replace_s"):
        decompose(fleet, baseline, sentinel.replace(manual_replace_s=60.0))
    # Names and sources are labels: they may differ.
    decompose(fleet, baseline.replace(sources={"x": "y"}), sentinel.replace(name="other"))


def test_the_rows_say_what_changed(fleet: Fleet) -> None:
    sentinel, baseline = _models()
    rows = decomposition_dict(decompose(fleet, baseline, sentinel))
    changes = {r["lever"]: r["change"] for r in rows}
    assert changes["checkpoint interval"].startswith("fixed 3600 s → Young/Daly ")
    assert changes["hot spares"] == f"none (30 min by hand) → {sentinel.spares} hot spares"
    assert changes["detection"].startswith("600 s every class → node ")
    # The live path moves the Young/Daly interval: the repair row says so.
    assert "live: node, link; warm restart: restart, hang, sdc" in changes["repair"]
    assert "the interval, over the failures that still roll back" in changes["repair"]
    text = render_decomposition(rows)
    assert text[0].startswith("where the gain comes from")
    assert [line.split("  ")[-1].split(":")[0] for line in text[3:-1]] == [
        f"+ {lever}" for lever in ORDER[1:]
    ]
    assert text[-1].endswith("= sentinel") and f"{100 * rows[-1]['ratio_mean']:.2f}%" in text[-1]


def test_a_drills_projection_is_the_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The drill's report decomposes what `sentinel goodput --from-demo` does, to the digit."""
    times = {"time_to_detect_s": {"ecc_dbe": 1.2, "crash": 0.5}, "time_to_resume_s": {"crash": 9}}
    path = tmp_path / "goodput.json"
    path.write_text(json.dumps(times))
    monkeypatch.setattr(drill_projection, "RUNS", 2)
    projection = drill_projection.drill_projection(times, str(path))
    fast = ["--runs", "2", "--compare-gpus", "1024", "--json"]
    assert main(["goodput", "--from-demo", str(path), *fast]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert projection["decomposition"] == rep["decomposition"]
    assert projection["drill_classes"] == ["node", "restart"]
    assert projection["command"] == f"sentinel goodput --from-demo {path}"
