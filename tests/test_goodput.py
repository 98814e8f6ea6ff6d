"""`sentinel goodput`: the fleet-scale failure-trace simulator."""

import itertools
import json
import math
import subprocess
from pathlib import Path

import pytest

from sentinel.cli import main
from sentinel.lab.goodput.checkpoint import CheckpointSpec
from sentinel.lab.goodput.model import baseline_model, sentinel_model
from sentinel.lab.goodput.simulate import CATEGORIES, Fleet, run_once
from sentinel.lab.goodput.trace import LLAMA3, FaultClass
from sentinel.lab.goodput.youngdaly import young_daly_interval

SEEDS = list(range(8))


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet(LLAMA3, gpus=16384, days=54, seeds=SEEDS)


def test_reference_trace_is_llama3_table_5() -> None:
    assert LLAMA3.total == 419 and LLAMA3.gpus == 16384 and LLAMA3.days == 54
    counts = {c.name: c.count for c in LLAMA3.categories}
    assert counts["Faulty GPU"] == 148 and counts["GPU HBM3 Memory"] == 72
    assert counts["Silent Data Corruption"] == 6
    assert {c.fault_class for c in LLAMA3.categories} == set(FaultClass)


def test_young_daly_formula_and_it_is_the_optimum(fleet: Fleet) -> None:
    assert young_daly_interval(5.0, 11135.0) == pytest.approx(math.sqrt(2 * 5.0 * 11135.0))
    assert young_daly_interval(2.0, 800.0) == pytest.approx(56.5685, rel=1e-5)
    with pytest.raises(ValueError):
        young_daly_interval(1.0, 0.0)
    # In the simulator, too, the Young/Daly interval beats a 4x shorter or longer one.
    model = sentinel_model(spares=8)
    tau = fleet.interval_for(model)
    assert tau == pytest.approx(math.sqrt(2 * model.checkpoint_cost_s * fleet.mtbf_s))
    best = fleet.evaluate(model).mean
    for other in (tau / 4, tau * 4, 3600.0):
        assert fleet.evaluate(model.replace(checkpoint_interval_s=other)).mean < best


def test_interruptions_match_the_trace_scale(fleet: Fleet) -> None:
    assert fleet.expected_interruptions == pytest.approx(419)
    mean = fleet.evaluate(sentinel_model()).mean_interruptions()
    assert abs(mean - 419) < 3 * math.sqrt(419 / len(SEEDS))
    half = Fleet(LLAMA3, gpus=8192, days=54, seeds=SEEDS)
    assert abs(half.evaluate(sentinel_model()).mean_interruptions() - 209.5) < 3 * math.sqrt(
        209.5 / len(SEEDS)
    )


def test_accounting_sums_to_wall_time(fleet: Fleet) -> None:
    # A 20x denser fleet makes failures strike during recoveries, the overlapping case.
    dense = Fleet(LLAMA3, gpus=16384 * 20, days=5, seeds=[1, 2])
    for f in (fleet, dense):
        for model in (sentinel_model(spares=2), baseline_model()):
            for run in f.evaluate(model).runs:
                assert all(v >= 0 for v in run.seconds.values())
                assert sum(run.seconds.values()) == pytest.approx(f.wall_s, rel=1e-9)
                assert 0 <= run.ratio < 1  # the dense baseline never gets going


def test_one_failure_by_hand() -> None:
    model = sentinel_model(spares=0, checkpoint_cost_s=10.0).replace(
        detect_s=dict.fromkeys(FaultClass, 5.0), resume_s=dict.fromkeys(FaultClass, 20.0)
    )
    run = run_once([(250.0, FaultClass.RESTART)], model, wall_s=1000.0, tau=100.0)
    # 2 cycles of 100+10, 30 s lost; then 725 s: 6 cycles and 65 s kept at the end.
    assert run.seconds == {
        "useful": 865.0,
        "rollback": 30.0,
        "checkpoint": 80.0,
        "detection": 5.0,
        "waiting": 0.0,
        "restart": 20.0,
        "stall": 0.0,
        "degraded": 0.0,
    }
    # A hardware failure with no spare waits for a manual replacement (30 min).
    run = run_once([(250.0, FaultClass.NODE)], model, wall_s=5000.0, tau=100.0)
    assert run.seconds["waiting"] == 1800.0
    # A failure during the wait keeps waiting for the node, then restarts once.
    run = run_once(
        [(250.0, FaultClass.NODE), (1000.0, FaultClass.RESTART)], model, wall_s=5000.0, tau=100.0
    )
    assert run.seconds["waiting"] == pytest.approx(1800.0 - 5.0)
    assert run.seconds["restart"] == 20.0 and run.seconds["detection"] == 10.0


def test_a_failure_before_the_async_write_commits_loses_the_interval_before() -> None:
    model = sentinel_model(spares=0, checkpoint_cost_s=10.0, checkpoint_commit_lag_s=5.0)
    model = model.replace(detect_s=dict.fromkeys(FaultClass, 5.0))
    model = model.replace(resume_s=dict.fromkeys(FaultClass, 20.0))
    # Struck 3 s after the second save's blocking part: that save is not committed yet, so
    # the job goes back to the first one (100 s + 3 s lost); 7 s later it would have held.
    late = run_once([(223.0, FaultClass.RESTART)], model, wall_s=1000.0, tau=100.0)
    assert late.seconds["rollback"] == 103.0
    held = run_once([(230.0, FaultClass.RESTART)], model, wall_s=1000.0, tau=100.0)
    assert held.seconds["rollback"] == 10.0
    for run in (late, held):
        assert sum(run.seconds.values()) == pytest.approx(1000.0)
    # A save cannot start before the previous one committed: the interval is at least the lag.
    tiny = Fleet(LLAMA3, gpus=16384, days=1, seeds=[0])
    assert tiny.interval_for(model.replace(checkpoint_interval_s=1.0)) == 5.0


def test_checkpoint_cost_is_derived_from_state_size_and_bandwidths() -> None:
    spec = CheckpointSpec()  # Llama 3 405B: 14 bytes a parameter, 2 TB/s storage
    assert spec.state_bytes == pytest.approx(5.67e12)
    assert spec.bytes_per_gpu(16384) == pytest.approx(0.346e9, rel=1e-3)
    assert spec.write_s == pytest.approx(2.835)
    assert spec.blocking_s(16384) == pytest.approx(0.0346 + 1.0, rel=1e-3)
    assert spec.commit_lag_s() == spec.write_s
    sync = CheckpointSpec(asynchronous=False)
    assert sync.blocking_s(16384) == pytest.approx(1.0 + 2.835) and sync.commit_lag_s() == 0.0
    # Half the fleet stages twice the bytes per GPU.
    assert spec.staging_s(8192) == pytest.approx(2 * spec.staging_s(16384))
    model = sentinel_model()
    assert model.checkpoint_cost_s == spec.blocking_s(16384)
    assert model.checkpoint_commit_lag_s == spec.write_s


def test_more_spares_never_lower_goodput(fleet: Fleet) -> None:
    ratios = [fleet.evaluate(sentinel_model(spares=k)).ratios for k in (0, 1, 2, 4, 8, 16)]
    for fewer, more in itertools.pairwise(ratios):
        assert all(b >= a - 1e-12 for a, b in zip(fewer, more, strict=True))
    assert sum(ratios[-1]) > sum(ratios[0])


def test_faster_detection_never_lowers_goodput(fleet: Fleet) -> None:
    base = sentinel_model()
    ratios = [fleet.evaluate(base.scale_detection(f)).ratios for f in (8.0, 2.0, 1.0, 0.5, 0.0)]
    for slower, faster in itertools.pairwise(ratios):
        assert all(b >= a - 1e-12 for a, b in zip(slower, faster, strict=True))
    assert sum(ratios[-1]) > sum(ratios[0])


def test_sentinel_beats_the_baseline(fleet: Fleet) -> None:
    assert fleet.evaluate(sentinel_model()).mean > fleet.evaluate(baseline_model()).mean + 0.1


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("name: x\ngpus: 8\ndays: 1\ncategories:\n  - {name: a, count: 1, fault_class: node}\n"
         "  - {name: b, count: -3, fault_class: node}\n", "categories.1.count"),
        ("name: x\ngpus: 8\ndays: 1\ncategories:\n  - {name: a, count: 1, fault_class: disk}\n",
         "categories.0.fault_class"),
        ("name: x\ndays: 1\ncategories:\n  - {name: a, count: 1, fault_class: node}\n", "gpus"),
        ("name: x\ngpus: 8\ndays: 1\nextra: 1\ncategories: []\n", "extra"),
    ],
)  # fmt: skip
def test_trace_schema_errors_exit_2_with_the_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, path: str
) -> None:
    f = tmp_path / "trace.yaml"
    f.write_text(body)
    assert main(["goodput", "--trace", str(f), "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert "invalid trace" in err and f"  {path}:" in err


def test_trace_file_json_and_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.json"
    cats = [
        {"name": "GPU", "count": 30, "fault_class": "node"},
        {"name": "bug", "count": 10, "fault_class": "restart"},
    ]
    f.write_text(json.dumps({"name": "small", "gpus": 1024, "days": 10, "categories": cats}))
    assert main(["goodput", "--trace", str(f), "--runs", "3", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["trace"]["interruptions"] == 40 and rep["fleet"]["expected_interruptions"] == 40
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["goodput", "--trace", str(tmp_path / "bad.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_json_output_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["goodput", "--runs", "2", "--json", "--gpus", "4096", "--days", "10"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep) >= {
        "trace",
        "fleet",
        "sentinel",
        "baseline",
        "delta",
        "decomposition",
        "levers",
        "target",
        "meets_target",
        "reaches_target",
    }
    for side in ("sentinel", "baseline"):
        s = rep[side]
        assert set(s["hours"]) == set(CATEGORIES)
        assert sum(s["hours"].values()) == pytest.approx(10 * 24)
        assert {"ratio_mean", "ratio_stdev", "checkpoint_interval_s", "spares"} <= set(s)
    assert rep["baseline"]["checkpoint_interval_s"] == 3600 and rep["baseline"]["spares"] == 0
    assert rep["sentinel"]["checkpoint_interval_rule"] == "young-daly"
    assert rep["delta"] == pytest.approx(
        rep["sentinel"]["ratio_mean"] - rep["baseline"]["ratio_mean"]
    )
    steps = rep["decomposition"]
    assert [r["lever"] for r in steps] == [
        "baseline",
        "checkpoint interval",
        "hot spares",
        "detection",
        "repair",
    ]
    # From the baseline's projection to Sentinel's, to the digit; the gains add up between.
    assert steps[0]["ratio_mean"] == rep["baseline"]["ratio_mean"]
    assert steps[-1]["ratio_mean"] == rep["sentinel"]["ratio_mean"]
    assert sum(r["gain"] for r in steps) == pytest.approx(rep["delta"], abs=1e-12)
    assert steps[-1]["checkpoint_interval_s"] == rep["sentinel"]["checkpoint_interval_s"]
    levers = {(r["lever"], r["setting"]) for r in rep["levers"]}
    assert {
        ("spares", "0"),
        ("spares", "8"),
        ("detection time", "x0.5"),
        ("checkpoint interval", "fixed 1 h"),
    } <= levers
    assert rep["fleet"]["gpus"] == 4096 and rep["fleet"]["runs"] == 2
    ckpt = rep["checkpoint"]
    assert ckpt["source"] == "derived" and ckpt["asynchronous"]
    assert ckpt["gb_per_gpu"] == pytest.approx(5.67e12 / 4096 / 1e9)
    assert rep["sentinel"]["checkpoint_cost_s"] == ckpt["blocking_s"] == ckpt["blocking_s_used"]
    assert rep["sentinel"]["checkpoint_commit_lag_s"] == ckpt["write_s"]
    assert any(r["lever"] == "checkpoint" and "synchronous" in r["setting"] for r in rep["levers"])
    by_class = rep["fleet"]["simulated_by_class_mean"]
    assert set(by_class) == set(FaultClass)
    assert sum(by_class.values()) == pytest.approx(rep["fleet"]["simulated_interruptions_mean"])


def test_overrides_and_demo_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Flags over the shipped measurements (a drill's goodput.json over a measurements file is
    tested in test_goodput_measurements.py)."""
    demo = tmp_path / "demo.json"
    args = [
        "goodput",
        "--runs",
        "1",
        "--json",
        "--days",
        "5",
        "--detect-s",
        "sdc=30",
        "--repair-s",
        "45",
        "--checkpoint-interval",
        "600",
        "--spares",
        "2",
    ]
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)["sentinel"]
    assert s["detect_s"]["sdc"] == 30.0 and set(s["resume_s"].values()) == {45.0}
    assert s["checkpoint_interval_s"] == 600 and s["spares"] == 2
    args = [
        "goodput",
        "--runs",
        "1",
        "--json",
        "--days",
        "2",
        "--sync-checkpoint",
        "--storage-tbps",
        "1",
        "--coordination-s",
        "0.5",
    ]
    assert main(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["sentinel"]["checkpoint_cost_s"] == pytest.approx(0.5 + 5.67)
    assert rep["sentinel"]["checkpoint_commit_lag_s"] == 0.0
    assert main(["goodput", "--runs", "1", "--json", "--checkpoint-cost", "3"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["sentinel"]["checkpoint_cost_s"] == rep["baseline"]["checkpoint_cost_s"] == 3.0
    assert rep["checkpoint"]["source"].startswith("command line")
    demo.write_text(json.dumps({"time_to_detect_s": {"meteor": 1}}))
    assert main(["goodput", "--from-demo", str(demo)]) == 2
    assert "unknown fault kind 'meteor'" in capsys.readouterr().err
    assert main(["goodput", "--detect-s", "node=-1"]) == 2
    assert main(["goodput", "--repair-s", "disk=5"]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["goodput", "--checkpoint-interval", "60", "--young-daly"])
    assert e.value.code == 2


def test_cli_human_output(sentinel_cmd: list[str]) -> None:
    out = subprocess.run(
        [*sentinel_cmd, "goodput", "--runs", "3"], capture_output=True, text=True, check=True
    ).stdout
    assert "419 interruptions in 54 days on 16384 GPUs" in out
    assert "effective training time ratio" in out
    assert "baseline (no Sentinel)" in out and "delta" in out
    decomposition = out.split("where the gain comes from")[1].split("\n\n")[0]
    steps = ("baseline (no Sentinel): ", "+ checkpoint interval: fixed 3600 s → Young/Daly")
    steps += ("+ hot spares: none", "+ detection: 600 s every class", "+ repair: ", "= sentinel")
    at = [decomposition.index(step) for step in steps]
    assert at == sorted(at)
    for row in ("spares: 0", "checkpoint interval: Young/Daly", "detection time: x2"):
        assert row in out
    assert "target 97.00%" in out
