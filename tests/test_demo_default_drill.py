"""`make demo`'s drill, whole: the default scenario's seven faults on 8 ranks, once on the paths
the fault catalog gives them and once with every repair a warm restart, each graded against
the clean reference run (shared by both through one cache). The shorter one-fault scenarios
are `test_demo_scenarios.py`'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from demo_checks import assert_same_model, demo, why


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo-reference")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_combined_default_drill_repairs_every_fault(tmp_path: Path, cache: Path) -> None:
    """What `make demo` runs, whole (not --quick, which moves its faults earlier), every repair
    a warm restart: seven faults on 8 ranks, each found by its own signal and repaired within
    5 s of its detection, no survivor's process restarted, bit-identical at the end. It is the
    drill of each of its faults too (the shipped one-fault scenarios are the same faults on
    smaller fleets), so each fault's own checks are here."""
    code, res, stdout = demo(
        "default", tmp_path, cache, quick=False, timeout_s=1400, recovery="warm_restart"
    )
    assert code == 0 and res["verdict"] == "pass", why(res)
    # the bad link: burn-in keeps its node out of the first launch, no incident for it
    assert res["burnin_excluded"] == ["node-3"]
    log = (tmp_path / "out" / "supervisor.log").read_text()
    assert "launching generation 0 on ['node-0', 'node-1', 'node-2', 'spare-0']" in log
    faults = {f["kind"]: f for f in res["faults"]}
    assert list(faults) == ["link_degraded", "corrupt_batch", "ecc_dbe", "thermal", "crash",
                            "xid", "hang"]  # fmt: skip
    assert all(f["detected"] for f in faults.values())
    assert [i["kind"] for i in res["incidents"]] == [
        "loss_spike", "gpu_hardware", "thermal", "rank_crash", "gpu_hardware", "collective_hang"
    ]  # fmt: skip
    # the corrupt batch: found at the step that consumed it, skipped, the LR eased back in
    assert faults["corrupt_batch"]["detected_step"] == faults["corrupt_batch"]["injected_step"]
    assert faults["corrupt_batch"]["actions"] == ["rollback", "skip_batches", "lr_scale", "resume"]
    assert faults["crash"]["target"] == "rank-3" and "replayed after rollback" in stdout
    struck = [faults[k]["struck_node"] for k in ("ecc_dbe", "thermal", "xid", "hang")]
    assert struck[:3] == ["node-2", "node-0", "node-1"]
    assert sorted(res["evicted_nodes"]) == sorted(struck)
    assert res["false_incidents"] == [] and res["completed_steps"] == 100
    assert res["bit_identical"] and res["final_digest"] == res["reference_digest"]
    for kind in ("ecc_dbe", "thermal", "crash", "xid", "hang"):
        assert 0 < faults[kind]["time_to_resume_s"] <= 60, (kind, faults[kind])
        assert faults[kind]["repaired"] and all(t["met"] for t in faults[kind]["targets"])
        assert faults[kind]["repair_path"] == "warm_restart"
        assert "resumed within 5 s of detection" in [t["target"] for t in faults[kind]["targets"]]
    assert all(r["survivors_restarted"] == 0 for r in res["repairs"]), res["repairs"]
    assert res["ledger_exact"] and res["tokens"]["duplicated"] == res["tokens"]["skipped"] == 0
    assert "verdict: PASS" in stdout
    goodput = json.loads((tmp_path / "out" / "goodput.json").read_text())
    assert set(goodput["time_to_detect_s"]) >= {"ecc_dbe", "thermal", "crash", "xid", "hang"}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_default_drill_on_each_faults_own_path(tmp_path: Path, cache: Path) -> None:
    """`make demo` itself: each fault on the path the fault catalog gives it. The job's two
    data-parallel replicas are fault domains (torchft): the ECC, thermal and XID faults take
    their replica out while the other keeps stepping and a spare heals from it; the corrupt
    batch, the crash and the hang restart every rank warm. Every sample of every step consumed
    once, the final loss the clean run's up to the order of the gradient sums.

    The thermal repair waits for a checkpoint first; when the crash ten steps later has stopped
    every rank by the time it restarts, no replica is left training and it takes the warm path
    (the supervisor logs the path it took, and that is the one judged)."""
    code, res, stdout = demo("default", tmp_path, cache, quick=False, timeout_s=1400)
    assert code == 0 and res["verdict"] == "pass", why(res)
    faults = {f["kind"]: f for f in res["faults"]}
    paths = {k: faults[k]["repair_path"] for k in ("ecc_dbe", "thermal", "xid", "crash", "hang")}
    thermal = paths.pop("thermal")
    assert thermal in {"live", "warm_restart"}
    assert paths == {
        "ecc_dbe": "live",
        "xid": "live",
        "crash": "warm_restart",
        "hang": "warm_restart",
    }
    live = [r for r in res["repairs"] if r["path"] == "live"]
    assert len(live) == 2 + (thermal == "live")
    assert all(r["checkpoint_reads"] == r["survivors_restarted"] == 0 for r in live), live
    assert all(r["survivor_stall_s"] <= 5 and r["join_s"] <= 15 for r in live), live
    assert res["ledger_exact"] and res["tokens"]["duplicated"] == res["tokens"]["skipped"] == 0
    assert_same_model(res)
    assert res["false_incidents"] == [] and res["completed_steps"] == 100
    assert "token ledger exact" in stdout and "verdict: PASS" in stdout
