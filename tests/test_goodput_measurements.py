"""`sentinel goodput` from measurements: the drills' merged times, the named assumptions and the
sensitivity table."""

import json
from pathlib import Path
from typing import Any

import pytest

from sentinel.cli import main
from sentinel.lab.goodput.drills import drill_of, samples_of
from sentinel.lab.goodput.measurements import (
    FORMAT,
    Drill,
    Measurements,
    Sample,
    dump,
    read_measurements,
    summarise,
)
from sentinel.lab.goodput.trace import FaultClass
from sentinel.scenario import load_scenario

FAST = ["--runs", "1", "--days", "5", "--json"]
DRILLS = [
    Drill(
        scenario="default",
        fleet="local",
        nodes=4,
        gpus_per_node=2,
        spares=5,
        layout="tp2 pp2 dp2",
        steps=86,
        compression=4,
        verdict="pass",
        burnin_kept_out=["link_degraded"],
    ),
    Drill(
        scenario="sdc",
        fleet="local",
        nodes=2,
        gpus_per_node=2,
        spares=1,
        layout="tp2 pp1 dp2",
        steps=32,
        compression=4,
        verdict="pass",
    ),
]
SAMPLES = [
    Sample(kind="ecc_dbe", fault_class=FaultClass.NODE, drill=0, detect_s=0.4, repair_s=32.0),
    Sample(kind="xid", fault_class=FaultClass.NODE, drill=0, detect_s=0.2, repair_s=30.0),
    Sample(kind="crash", fault_class=FaultClass.RESTART, drill=0, detect_s=0.6, repair_s=30.0),
    Sample(kind="hang", fault_class=FaultClass.HANG, drill=0, detect_s=17.5, repair_s=36.0,
           watchdog_timeout_s=15.0),
    Sample(kind="sdc", fault_class=FaultClass.SDC, drill=1, detect_s=4.0, repair_s=40.0,
           detect_steps=13),
]  # fmt: skip


def measurements(samples: list[Sample] = SAMPLES) -> Measurements:
    return Measurements(
        format=FORMAT,
        date="2026-01-02",
        command="python benchmarks/x.py",
        machine="test",
        drills=DRILLS,
        samples=samples,
        classes=summarise(DRILLS, samples),
    )


@pytest.fixture
def meas_file(tmp_path: Path) -> Path:
    f = tmp_path / "m.json"
    f.write_text(dump(measurements()))
    return f


def project(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["goodput", *FAST, *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_default_run_reads_the_shipped_measurements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shipped, where = read_measurements()
    assert where == "sentinel/data/goodput_measurements.json"
    assert shipped.command.startswith("python benchmarks/goodput_measurements.py")
    rep = project(capsys)
    m = rep["measurements"]
    assert m["file"] == "sentinel/data/goodput_measurements.json"
    assert (m["date"], m["command"]) == (shipped.date, shipped.command)
    measured = {r["key"] for r in rep["inputs"] if r["origin"] == "measured"}
    # A repair with recorded stages is given by them: the projection carries them to scale.
    assert {
        "sentinel.detect_s.node",
        "sentinel.repair_stage_s.node.relaunch",
        "sentinel.detect_s.restart",
        "sentinel.hang_past_watchdog_s",
        "sentinel.repair_stage_s.hang.rendezvous",
    } <= measured
    assert not {r["key"] for r in rep["inputs"]} & {"sentinel.resume_s.node"}
    node = next(r for r in rep["inputs"] if r["key"] == "sentinel.detect_s.node")
    assert rep["sentinel"]["detect_s"]["node"] == node["value"] == shipped.classes["node"].detect_s
    # A link fault is kept out by burn-in in the drills: its times are assumptions, said so.
    link = [r for r in rep["inputs"] if ".link" in r["key"]]
    assert link and all(r["origin"] == "assumption" and "burn-in" in r["source"] for r in link)
    assert main(["goodput", "--runs", "1", "--days", "5"]) == 0
    out = capsys.readouterr().out
    assert f"sentinel/data/goodput_measurements.json ({shipped.date})" in out
    assert f"made by: {shipped.command}" in out and "sensitivity" in out


def test_inputs_come_from_the_file_and_hang_and_sdc_through_the_shipped_settings(
    capsys: pytest.CaptureFixture[str], meas_file: Path
) -> None:
    rep = project(capsys, "--measurements", str(meas_file), "--recovery", "restart")
    s = rep["sentinel"]
    step = next(r["value"] for r in rep["inputs"] if r["key"] == "step_s")
    assert s["detect_s"]["node"] == 0.3 and s["resume_s"]["node"] == 31.0
    assert s["detect_s"]["hang"] == pytest.approx(60.0 + 2.5)  # the shipped floor + past it
    assert s["detect_s"]["sdc"] == pytest.approx(13 * 4 * step)
    assert s["resume_s"]["link"] == 31.0  # the node's repair, named as an assumption
    # This file has no stages: each repair is taken whole at any scale, said so.
    node = next(r for r in rep["inputs"] if r["key"] == "sentinel.resume_s.node")
    assert "taken whole at any scale" in node["source"]
    assert str(meas_file) in s["sources"]["detect_s"]


def test_overrides_replace_the_measured_inputs(
    capsys: pytest.CaptureFixture[str], meas_file: Path, tmp_path: Path
) -> None:
    demo = tmp_path / "goodput.json"
    demo.write_text(
        json.dumps(
            {"time_to_detect_s": {"xid": 7.0, "hang": 95.0}, "time_to_resume_s": {"crash": 45.0}}
        )
    )
    rep = project(
        capsys,
        "--measurements",
        str(meas_file),
        "--from-demo",
        str(demo),
        "--detect-s",
        "sdc=30",
        "--node-repair-h",
        "24",
        "--recovery",
        "restart",
    )
    s = rep["sentinel"]
    assert s["detect_s"] == {"node": 7.0, "restart": 0.6, "hang": 95.0, "sdc": 30.0, "link": 60.0}
    assert s["resume_s"]["restart"] == 45.0 and s["resume_s"]["node"] == 31.0
    assert s["node_repair_h"] == 24.0
    origin = {r["key"]: r["origin"] for r in rep["inputs"]}
    assert origin["sentinel.detect_s.sdc"] == origin["node_repair_h"] == "command line"
    assert "sentinel.hang_past_watchdog_s" not in origin  # replaced by the drill's own figure
    assert str(demo) in s["sources"]["detect_s"]


def _write(tmp_path: Path, doc: Any) -> Path:
    f = tmp_path / "bad.json"
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return f


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda d: d["samples"][0].update(detect_s=-1), "samples.0.detect_s: Input should be "
         "greater than or equal to 0"),
        (lambda d: d["classes"]["node"].update(detect_s=5.0),
         "classes.node.detect_s: 5.0 does not match its samples (0.3)"),
        (lambda d: d["samples"][1].update(drill=7), "samples.1.drill: no drill 7 (there are 2)"),
        (lambda d: d.pop("date"), "date: Field required"),
        (lambda d: d["classes"].pop("sdc"), "classes.sdc: missing"),
        (lambda d: d.update(format="other/9"), "format: Input should be"),
    ],
)  # fmt: skip
def test_a_bad_measurements_file_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, error: str
) -> None:
    doc = measurements().model_dump(mode="json")
    change(doc)
    f = _write(tmp_path, doc)
    assert main(["goodput", "--runs", "1", "--measurements", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}: invalid goodput measurements" in err and error in err


def test_an_unreadable_measurements_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["goodput", "--measurements", str(_write(tmp_path, "{oops"))]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["goodput", "--measurements", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_sensitivity_moves_the_right_way(
    capsys: pytest.CaptureFixture[str], meas_file: Path, tmp_path: Path
) -> None:
    # The live path's stall and join at their targets (5 s, 15 s), not the shipped run's 1.65 s
    # and 1.41 s: halving those saves ~5e-5 of 3 runs of 20 days, less than the change in where
    # later faults land when one window shortens, so their direction could not be read.
    way = {"wall_s": 60.0, "steps": 210, "checkpoint_reads": 0, "ledger_exact": True}
    bench = {
        w: way | {"stall_s_max": 5.0, "join_s_max": 15.0}
        for w in ("restart", "warm_restart", "live")
    }
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    args = ["--measurements", str(meas_file), "--recovery-bench", str(tmp_path / "bench.json")]
    rep = project(capsys, *args, "--runs", "3", "--days", "20")
    head = rep["sentinel"]["ratio_mean"]
    rows = {r["key"]: r for r in rep["sensitivity"]}
    assert set(rows) == {r["key"] for r in rep["inputs"]}
    slower = [k for k in rows if k.startswith(("sentinel.", "hang_watchdog_s", "step_s", "live."))]
    slower += [
        "node_repair_h",
        "manual_replace_min",
        "checkpoint.coordination_s",
        "scale.comm_s_per_krank",
        "scale.start_tail",
    ]
    for key in slower:  # more time spent never raises goodput
        half, double = rows[key]["points"]
        assert (half["factor"], double["factor"]) == (0.5, 2.0)
        assert half["sentinel_ratio"] >= head - 1e-12 >= double["sentinel_ratio"] - 2e-12, key
    for key in ("scale.read_gbps", "scale.peer_gbps"):  # (staging also sets the interval)
        half, double = rows[key]["points"]  # more bandwidth never lowers it
        assert half["sentinel_ratio"] <= head + 1e-12 <= double["sentinel_ratio"] + 2e-12, key
    # A crash takes the warm restart (a full stop) in the live configuration: its detection counts.
    detect = rows["sentinel.detect_s.restart"]["points"]
    assert detect[0]["sentinel_ratio"] > detect[1]["sentinel_ratio"]
    for key in ("baseline.detect_s", "baseline.interval_s"):  # a slower baseline: a wider delta
        half, double = rows[key]["points"]
        assert half["sentinel_ratio"] == double["sentinel_ratio"] == head
        assert half["delta"] < rep["delta"] < double["delta"], key


def test_assumptions_are_listed_with_their_sources(
    capsys: pytest.CaptureFixture[str], meas_file: Path
) -> None:
    rep = project(capsys, "--measurements", str(meas_file))
    assumed = {r["key"]: r["source"] for r in rep["assumptions"]}
    assert {
        "node_repair_h",
        "checkpoint.storage_tbps",
        "checkpoint.coordination_s",
        "step_s",
        "baseline.detect_s",
        "sentinel.detect_s.link",
        "scale.comm_s_per_krank",
        "scale.start_tail",
        "scale.read_gbps",
        "scale.peer_gbps",
        "layout.replica_gpus",
    } <= set(assumed)
    assert not {"live.stall_s", "live.join_s"} & set(assumed)  # measured by the shipped run
    assert all(len(src) > 10 for src in assumed.values())
    assert "Llama 3" in assumed["checkpoint.storage_tbps"]
    assert "Llama 3" in assumed["step_s"] and "NCCL" in assumed["baseline.detect_s"]
    assert not {r["key"] for r in rep["assumptions"]} & {"sentinel.detect_s.node"}


def test_the_coordinator_s_recorded_stages_are_the_repair_s_inputs_carried_to_scale(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A class whose samples carry the coordinator's recorded stages is given by them: each
    stage the model reads is a measured input named with the file and drills it came from, and
    varied in the sensitivity table; the whole repair and the drills' own checkpoint load are
    not inputs (the read at the fleet's bandwidths replaces the load). Today's restart of a
    node at 16,384 GPUs is then the sum of its parts at that scale."""
    stages = {
        "decide": 0.5,
        "drain": 1.0,
        "relaunch": 10.0,
        "rendezvous": 0.4,
        "checkpoint_load": 2.0,
        "build_first_step": 1.5,
    }
    staged = [
        SAMPLES[0].model_copy(update={"stages_s": stages}),
        SAMPLES[1].model_copy(update={"stages_s": {**stages, "decide": 1.5}}),
        *SAMPLES[2:],
    ]
    f = tmp_path / "m.json"
    f.write_text(dump(measurements(staged)))
    rep = project(capsys, "--measurements", str(f), "--recovery", "restart")
    inputs = {r["key"]: r for r in rep["inputs"]}
    node = {k for k in inputs if k.startswith("sentinel.repair_stage_s.node.")}
    assert node == {f"sentinel.repair_stage_s.node.{n}" for n in stages if n != "checkpoint_load"}
    assert "sentinel.resume_s.node" not in inputs
    decide = inputs["sentinel.repair_stage_s.node.decide"]
    assert decide["value"] == 1.0 and decide["origin"] == "measured"
    assert str(f) in decide["source"] and "coordinator-recorded stage decide" in decide["source"]
    assert node <= {r["key"] for r in rep["sensitivity"]}
    # Today's restart at 16,384 GPUs (2,048 nodes): decision and drain, the slowest node's start,
    # the communicator at 16,384 ranks, the read of 5.67 TB at 2 TB/s, the build.
    start = 10.0 * (1 + 0.1 * sum(1 / i for i in range(1, 2049)))
    comm = 0.4 + 265 / 96 * 16.384
    want = 1.0 + 1.0 + start + comm + 405e9 * 14 / 2e12 + 1.5
    assert rep["sentinel"]["resume_s"]["node"] == pytest.approx(want, rel=1e-4)


def _fault(kind: str, detect: float | None, resume: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "detected": detect is not None,
        "time_to_detect_s": detect,
        "time_to_resume_s": resume,
        "repaired": resume is not None,
        "injected_step": 15,
        "detected_step": 15,
        "actions": [],
        "targets": [],
        **extra,
    }


def test_a_drill_result_becomes_samples_and_a_class_without_one_says_why() -> None:
    hang_target = {"target": "detected within the watchdog timeout + 10 s", "limit": 27.0}
    result = {
        "scenario": "default",
        "verdict": "pass",
        "drill_settings": {"compression": 4},
        "faults": [
            _fault("link_degraded", None, None, actions=["burnin.exclude"]),
            _fault("ecc_dbe", 0.4, 32.0, repair_stages_s={"decide": 0.5, "relaunch": 9.0}),
            _fault("thermal", 0.1, None, repair_stages_s={"decide": 7.0}),  # not repaired
            _fault("hang", 20.0, 35.0, targets=[hang_target]),
            _fault("straggler", 9.0, 20.0),  # does not interrupt the job: not a sample
        ],
    }
    drill = drill_of(result, load_scenario("default"))
    assert (drill.nodes, drill.layout) == (4, "tp2 pp2 dp2")
    assert drill.burnin_kept_out == ["link_degraded"]
    samples = samples_of(result, 0)
    assert [s.kind for s in samples] == ["ecc_dbe", "thermal", "hang"]
    classes = summarise([drill], samples)
    assert classes[FaultClass.NODE].detect_s == 0.25 and classes[FaultClass.NODE].repair_s == 32.0
    assert classes[FaultClass.NODE].samples == 2
    assert classes[FaultClass.NODE].stages_s == {"decide": 0.5, "relaunch": 9.0}
    assert classes[FaultClass.HANG].past_watchdog_s == 3.0  # 20 s against a 17 s timeout
    assert classes[FaultClass.LINK].detect_s is None and classes[FaultClass.LINK].samples == 0
    assert "burn-in keeps a degraded link out" in (classes[FaultClass.LINK].note or "")
    assert classes[FaultClass.RESTART].note and classes[FaultClass.SDC].samples == 0


def test_hang_mirrors_match_the_shipped_hooks() -> None:
    from sentinel.lab.goodput.inputs import HANG_FLOOR_S, HANG_K
    from trainer_hooks.config import HooksConfig

    assert (HooksConfig().hang_floor_s, HooksConfig().hang_k) == (HANG_FLOOR_S, HANG_K)
