"""`sentinel goodput`'s repair paths at scale: how a repair's parts grow with the ranks, the spare
pool by rule, which class takes which path, the live path in the simulator, the recovery
benchmark's figures as inputs, and the paths side by side."""

import json
from pathlib import Path
from typing import Any

import pytest

from sentinel.cli import main
from sentinel.commands.goodput_cmd import RECOVERY
from sentinel.lab.goodput.compare import rule_spares
from sentinel.lab.goodput.inputs import default_rows
from sentinel.lab.goodput.measurements import read_measurements
from sentinel.lab.goodput.model import LiveSpec, RepairPath, sentinel_model
from sentinel.lab.goodput.paths import KIND_PATH, Recovery, catalog_path, new_process, paths_for
from sentinel.lab.goodput.repairs import Layout, restart_parts, warm_parts
from sentinel.lab.goodput.scaling import (
    harmonic,
    poisson_quantile,
    read_s,
    slowest_start_s,
    spares_for,
    throughput,
)
from sentinel.lab.goodput.simulate import Fleet, run_once
from sentinel.lab.goodput.trace import LLAMA3, NEEDS_NODE, FaultClass

FAST = ["--runs", "1", "--days", "5", "--json"]


def project(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["goodput", *FAST, *args]) == 0
    return json.loads(capsys.readouterr().out)


def shipped_values() -> dict[str, float]:
    meas, where = read_measurements()
    return {r.key: r.value for r in default_rows(meas, where)}


def test_each_part_of_a_repair_grows_with_the_ranks_as_modelled() -> None:
    # The slowest of n nodes: start x (1 + tail x H(n)); H(n) ~ ln n + 0.577.
    assert harmonic(1) == 1.0 and harmonic(4) == pytest.approx(25 / 12)
    assert harmonic(12500) == pytest.approx(sum(1 / i for i in range(1, 12501)), rel=1e-9)
    assert slowest_start_s(10.0, 1, 0.1) == pytest.approx(11.0)
    assert slowest_start_s(10.0, 12500, 0.1) == pytest.approx(10 * (1 + 0.1 * harmonic(12500)))
    # A read is each rank's shard at its bandwidth, capped by the shared tier for all at once.
    assert read_s(1e9, 8, 5.0, 2.0) == pytest.approx(0.2)  # 8 GB in all: the rank's own
    assert read_s(1e9, 16384, 5.0, 2.0) == pytest.approx(16384 / 2000)  # the tier's cap
    values = shipped_values()
    small, big = Layout.of(values, 16384), Layout.of(values, 100000)
    assert (small.nodes, small.replicas, big.nodes, big.replicas) == (2048, 128, 12500, 781)
    r16, r100 = (
        restart_parts(values, FaultClass.NODE, small),
        restart_parts(values, FaultClass.NODE, big),
    )
    comm = "communicator setup, every rank"
    assert r100[comm] - r16[comm] == pytest.approx(265 / 96 * (100 - 16.384))
    assert r100["process start, slowest node"] > r16["process start, slowest node"]
    assert r100["decision and drain"] == r16["decision and drain"]  # Sentinel's own: flat
    # A warm restart starts no process for a node fault (a warm spare), one for a crash.
    warm = warm_parts(values, FaultClass.NODE, big, replicated=True)
    crash = warm_parts(values, FaultClass.RESTART, big, replicated=True)
    assert warm["new process for the faulty rank"] == 0.0
    assert crash["new process for the faulty rank"] > 0.0
    assert sum(warm.values()) < sum(r100.values())
    # With a full copy per replica, a GPU holds 5.67 TB / 128 and reloads it from host memory.
    assert warm["state load in process"] == pytest.approx(405e9 * 14 / 128 / 10e9)


def test_a_missing_replica_costs_the_microbatch_granularity_when_the_batch_is_kept() -> None:
    assert throughput(128, 0, 16, keep_batch=True) == 1.0
    # 128 x 16 microbatches over 127 replicas: some take 17, and the step waits for them.
    assert throughput(128, 1, 16, keep_batch=True) == pytest.approx(16 / 17)
    assert throughput(128, 1, 16, keep_batch=False) == pytest.approx(127 / 128)
    assert throughput(4, 2, 1, keep_batch=True) == pytest.approx(1 / 2)
    assert throughput(4, 4, 1, keep_batch=True) == 0.0


def test_the_spare_pool_grows_with_the_fleet() -> None:
    assert poisson_quantile(0.0, 0.999) == 0 and poisson_quantile(1.0, 0.5) == 1
    # Llama 3's node-needing failures: 356 in 54 days on 16,384 GPUs, 12 h each in repair.
    values = shipped_values()
    rate16 = LLAMA3.rate_per_s(16384, NEEDS_NODE)
    assert rate16 * 54 * 86400 == pytest.approx(356)
    spares = [rule_spares(LLAMA3, g, values) for g in (1024, 16384, 100000)]
    assert spares == [3, 10, 35]
    assert spares_for(0.0, 43200) == 1  # at least one


def test_each_class_takes_the_catalog_s_path() -> None:
    assert {k: str(v) for k, v in KIND_PATH.items()} == {
        "ecc_dbe": "live",
        "xid": "live",
        "thermal": "live",
        "link_degraded": "live",
        "crash": "warm_restart",
        "hang": "warm_restart",
        "sdc": "warm_restart",
    }
    assert {c: catalog_path(c) for c in FaultClass} == {
        FaultClass.NODE: RepairPath.LIVE,
        FaultClass.LINK: RepairPath.LIVE,
        FaultClass.RESTART: RepairPath.WARM_RESTART,
        FaultClass.HANG: RepairPath.WARM_RESTART,
        FaultClass.SDC: RepairPath.WARM_RESTART,
    }
    assert set(paths_for(Recovery.RESTART).values()) == {RepairPath.RESTART}
    assert set(paths_for(Recovery.WARM_RESTART).values()) == {RepairPath.WARM_RESTART}
    assert [c for c in FaultClass if new_process(c)] == [FaultClass.RESTART, FaultClass.HANG]
    assert tuple(r.value for r in Recovery) == RECOVERY
    # A job with one replica cannot lose one: its live classes take the warm restart.
    live = LiveSpec(stall_s=5, regroup_s=0, join_s=15, replicas=1, microbatches=1)
    model = sentinel_model().replace(path=paths_for(Recovery.CATALOG), live=live)
    assert model.path_of(FaultClass.NODE) == RepairPath.WARM_RESTART


def live_model(spares: int) -> Any:
    live = LiveSpec(stall_s=4.0, regroup_s=1.0, join_s=20.0, replicas=4, microbatches=1)
    return sentinel_model(spares=spares, checkpoint_cost_s=10.0).replace(
        detect_s=dict.fromkeys(FaultClass, 2.0),
        resume_s=dict.fromkeys(FaultClass, 30.0),
        path=paths_for(Recovery.CATALOG),
        live=live,
    )


def test_a_live_fault_by_hand() -> None:
    """A node fault at 250 s: the survivors stall 5 s (the measured 4 s, then 1 s to regroup),
    step at 3 of 4 replicas' rate (keeping the batch: 4 microbatches on 3 replicas, the step
    waits for the one with 2: half rate) until the spare, detected at 252 s, has joined (272 s),
    then stall 1 s as it joins. Nothing is rolled back."""
    run = run_once([(250.0, FaultClass.NODE)], live_model(spares=1), wall_s=1000.0, tau=100.0)
    s = run.seconds
    assert s["stall"] == pytest.approx(5.0 + 1.0)
    assert s["rollback"] == 0.0 and s["restart"] == 0.0 and s["detection"] == 0.0
    assert s["degraded"] == pytest.approx(0.5 * (272.0 - 255.0))
    assert sum(s.values()) == pytest.approx(1000.0)
    # A crash takes the warm restart: a full stop, with its rollback (30 s since the last save).
    run = run_once([(250.0, FaultClass.RESTART)], live_model(spares=1), wall_s=1000.0, tau=100.0)
    assert run.seconds["rollback"] == 30.0 and run.seconds["restart"] == 30.0
    assert run.seconds["stall"] == 0.0


def test_a_live_fault_without_a_spare_runs_degraded_until_a_node_comes() -> None:
    """No spare: the replica is out from 250 s until a node replaced by hand (30 min after the
    detection at 252 s) has joined, at 2,072 s. The job trains at half rate in that window
    except while stalled (250-255 s) and saving: 70 s to the end of its cycle, a 10 s save at
    325 s, then 15 cycles of 110 s and 87 s: 1,657 s of training."""
    run = run_once([(250.0, FaultClass.NODE)], live_model(spares=0), wall_s=5000.0, tau=100.0)
    assert run.seconds["waiting"] == 0.0 and run.seconds["rollback"] == 0.0
    assert run.seconds["degraded"] == pytest.approx(0.5 * 1657.0)
    assert run.seconds["stall"] == pytest.approx(5.0 + 1.0)
    assert sum(run.seconds.values()) == pytest.approx(5000.0)


def test_the_checkpoint_interval_counts_only_the_failures_that_roll_back() -> None:
    fleet = Fleet(LLAMA3, gpus=16384, days=1, seeds=[0])
    today = sentinel_model()
    live = live_model(spares=8).replace(checkpoint_cost_s=today.checkpoint_cost_s)
    assert fleet.rollback_mtbf_s(today) == pytest.approx(fleet.mtbf_s)
    counts = LLAMA3.counts_by_class()
    full_stop = counts[FaultClass.RESTART] + counts[FaultClass.HANG] + counts[FaultClass.SDC]
    assert fleet.rollback_mtbf_s(live) == pytest.approx(fleet.mtbf_s * 419 / full_stop)
    assert fleet.interval_for(live) > fleet.interval_for(today)


def bench_line(**live: Any) -> dict[str, Any]:
    way = {
        "wall_s": 300.0,
        "steps": 240,
        "stall_s_max": None,
        "join_s_max": None,
        "checkpoint_reads": 3,
        "ledger_exact": True,
    }
    good = {
        "wall_s": 250.0,
        "steps": 240,
        "stall_s_max": 3.2,
        "join_s_max": 11.5,
        "checkpoint_reads": 0,
        "ledger_exact": True,
    }
    return {"restart": way, "warm_restart": way, "live": {**good, **live}}


def test_the_recovery_benchmark_s_live_times_become_measured_inputs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "recovery.txt"
    out.write_text(
        "way        wall_s  steps\nlive        250.0   240\n"
        + json.dumps({**bench_line(), "date": "2026-12-01", "load_avg": "3.1"})
        + "\n"
    )
    rep = project(capsys, "--recovery-bench", str(out))
    inputs = {r["key"]: r for r in rep["inputs"]}
    stall, join = inputs["live.stall_s"], inputs["live.join_s"]
    assert (stall["value"], join["value"]) == (3.2, 11.5)
    assert stall["origin"] == join["origin"] == "measured"
    assert f"{out} (2026-12-01, load average 3.1)" in stall["source"]
    assert rep["sentinel"]["live"]["stall_s"] == 3.2
    # Without it, the shipped run's, measured, named with its file, date and load.
    rep = project(capsys)
    stall = next(r for r in rep["inputs"] if r["key"] == "live.stall_s")
    assert stall["origin"] == "measured"
    assert stall["source"].startswith("sentinel/data/recovery_bench.json (2026-")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("", "empty"),
        ("table only\n{not json", "last line is not valid JSON"),
        (json.dumps({"restart": {}, "live": {}}), "warm_restart: Field required"),
        (json.dumps(bench_line(stall_s_max=-1)), "live.stall_s_max: Input should be greater"),
        (json.dumps(bench_line(join_s_max=None)), "live.join_s_max: Input should be a valid number"),
        (json.dumps(bench_line(ledger_exact="yes")), "live.ledger_exact: Input should be a valid boolean"),
        (json.dumps(bench_line(ledger_exact=False)), "live.ledger_exact is false"),
        (json.dumps([1, 2]), "invalid recovery benchmark figures"),
    ],
)  # fmt: skip
def test_a_bad_recovery_benchmark_file_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, body: str, error: str
) -> None:
    f = tmp_path / "bench.json"
    f.write_text(body)
    assert main(["goodput", "--runs", "1", "--recovery-bench", str(f)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and error in err
    assert main(["goodput", "--runs", "1", "--recovery-bench", str(tmp_path / "none")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_report_shows_the_paths_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    rep = project(capsys)
    c = rep["compare"]
    assert [s["gpus"] for s in c["scales"]] == [16384, 100000]
    for s in c["scales"]:
        assert {"baseline", "restart", "warm_restart", "catalog", "spares", "repairs"} <= set(s)
    small, big = c["scales"]
    assert (small["spares"], big["spares"]) == (10, 35)
    assert big["catalog"]["ratio_mean"] > big["restart"]["ratio_mean"]
    restart = big["repairs"]["restart"]["node"]
    assert restart["total_s"] == pytest.approx(sum(restart["parts_s"].values()))
    assert big["repairs"]["live_path"]["stall_by_class_s"]["link"] > 60  # its detection first
    assert c["goal"]["gpus"] == 100000 and c["goal"]["target"] == 0.9
    assert c["goal"]["met"] == (c["goal"]["live_ratio"] >= 0.9)
    assert c["paths"] == {
        "node": "live",
        "restart": "warm_restart",
        "hang": "warm_restart",
        "sdc": "warm_restart",
        "link": "live",
    }
    assert main(["goodput", "--runs", "1", "--days", "5", "--compare-gpus", "4096,8192"]) == 0
    out = capsys.readouterr().out
    for text in (
        "restart (today's path)",
        "warm restart",
        "live (the catalog's paths)",
        "4,096 GPUs",
        "8,192 GPUs",
        "goal 90.00% at 8,192 GPUs",
        "spares by rule",
    ):
        assert text in out


def test_fixed_spares_replica_size_and_a_shrinking_batch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rep = project(
        capsys,
        "--spares",
        "8",
        "--replica-gpus",
        "256",
        "--shrink-batch",
        "--compare-gpus",
        "16384",
    )
    assert rep["sentinel"]["spares"] == 8 and rep["compare"]["scales"][0]["spares"] == 8
    assert rep["sentinel"]["live"]["replicas"] == 64
    assert rep["sentinel"]["live"]["keep_batch"] is False
    origin = {r["key"]: r["origin"] for r in rep["inputs"]}
    assert origin["layout.replica_gpus"] == "command line"
    rep = project(capsys, "--recovery", "restart", "--compare-gpus", "16384")
    assert set(rep["sentinel"]["paths"].values()) == {"restart"} and rep["sentinel"]["live"] is None
    with pytest.raises(SystemExit) as e:
        main(["goodput", "--compare-gpus", "16384,x"])
    assert e.value.code == 2


def test_a_repair_given_whole_replaces_its_stages_and_is_taken_as_it_is_at_any_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for gpus in ("16384", "100000"):
        rep = project(
            capsys,
            "--repair-s",
            "restart=45",
            "--recovery",
            "restart",
            "--gpus",
            gpus,
            "--compare-gpus",
            "16384",
        )
        assert rep["sentinel"]["resume_s"]["restart"] == 45.0
        keys = {r["key"] for r in rep["inputs"]}
        assert "sentinel.resume_s.restart" in keys
        assert not any(k.startswith("sentinel.repair_stage_s.restart.") for k in keys)
        assert any(k.startswith("sentinel.repair_stage_s.node.") for k in keys)
    assert rep["sentinel"]["resume_s"]["node"] > 300  # node's, from its stages at 100,000 GPUs
