"""`sentinel demo` end to end on shipped scenarios, shortened with --quick: a real coordinator,
simulated agents, `sentinel run` supervising the reference trainer, faults injected, the drill
report graded against a clean reference run (shared by the tests through one cache)."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from demo_checks import assert_same_model, why
from terminal import ANSI, run_in_pty

from sentinel.fr.dumps import load_dir

SENTINEL = [sys.executable, "-m", "sentinel"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo-reference")


def demo(
    scenario: str,
    tmp_path: Path,
    cache: Path,
    quick: bool = True,
    timeout_s: float = 420,
    recovery: str | None = None,
) -> tuple[int, dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    env["SENTINEL_DEMO_CACHE"] = str(cache)
    out, result = tmp_path / "out", tmp_path / "result.json"
    done = subprocess.run(
        [*SENTINEL, "demo", "--scenario", scenario, *(["--quick"] if quick else []),
         *(["--recovery", recovery] if recovery else []), "--out", str(out), "--json",
         str(result)],
        env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert result.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "report.html").exists() and (out / "goodput.json").exists()
    # The live timeline, saved line by line in the run directory as it was printed.
    timeline = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    assert (
        any(e["kind"] == "fault" for e in timeline) or not json.loads(result.read_text())["faults"]
    )
    return done.returncode, json.loads(result.read_text()), done.stdout


def assert_repaired(res: dict[str, Any], kind: str, incident: str, evicted: list[str]) -> None:
    assert res["verdict"] == "pass", json.dumps(res, indent=1)
    (fault,) = res["faults"]
    assert fault["kind"] == kind and fault["detected"]
    assert [i["kind"] for i in res["incidents"]] == [incident]
    assert res["false_incidents"] == [] and res["evicted_nodes"] == evicted
    assert_same_model(res)
    assert res["ledger_exact"] and res["tokens"]["consumed"] == res["tokens"]["expected"]
    assert fault["time_to_detect_s"] is not None and 0 < fault["time_to_resume_s"] <= 60
    assert fault["repaired"] and all(t["met"] for t in fault["targets"]), fault["targets"]
    assert_stages_recorded(res["incidents"][0], fault, drained=bool(evicted))


RELAUNCH = ["restart", "relaunched", "rendezvoused", "checkpoint_loaded", "first_step"]


def assert_stages_recorded(inc: dict[str, Any], fault: dict[str, Any], drained: bool) -> None:
    """The coordinator recorded the repair's stages from the new gang's `rank.launch` (real
    agents relaying the reference trainer's hooks), in order, ending at the first step."""
    at = inc["stages"]
    order = ["detected", "decided", *(["drained"] if drained else []), *RELAUNCH]
    assert list(at) == order, at
    assert all(at[a] <= at[b] for a, b in itertools.pairwise(order)), at
    assert 0 < at["first_step"] - at["restart"] <= 60
    segments = fault["repair_stages_s"]
    assert {"decide", "relaunch", "rendezvous", "checkpoint_load", "build_first_step"} <= set(
        segments
    ), segments
    assert sum(segments.values()) == pytest.approx(at["first_step"] - at["detected"], abs=0.05)


def test_bad_scenario_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("fleet: {nodes: 2, gpus_per_node: 2}\ntrainer: {tp: 2, pp: 2, dp: 2}\n")
    for scenario in ("no-such-scenario", str(bad)):
        done = subprocess.run([*SENTINEL, "demo", "--scenario", scenario, "--out",
                               str(tmp_path / "o")], capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert not (tmp_path / "o").exists()
    assert "must equal the fleet's GPUs" in done.stderr


@pytest.mark.slow
def test_a_straggler_node_is_swapped_for_the_spare(tmp_path: Path, cache: Path) -> None:
    # rank 1 runs 60% slow on node-0; its node is swapped at the checkpoint after its scoring
    # windows: --quick keeps the steps those need (60 of 70).
    code, res, _ = demo("straggler", tmp_path, cache)
    assert code == 0, why(res, tmp_path / "out")
    assert_repaired(res, "straggler", "straggler", ["node-0"])
    assert res["faults"][0]["struck_node"] == "node-0"


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
    assert code == 0 and res["verdict"] == "pass", why(res, tmp_path / "out")
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
    assert faults["corrupt_batch"]["actions"] == [
        "evidence",
        "rollback",
        "skip_batches",
        "lr_scale",
        "resume",
    ]
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
    (the supervisor logs the path it took, and that is the one judged). A live join the hang
    (ten steps after the XID) cuts short is named on the repair."""
    code, res, stdout = demo("default", tmp_path, cache, quick=False, timeout_s=1400)
    assert code == 0 and res["verdict"] == "pass", why(res, tmp_path / "out")
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
    assert all(r["survivor_stall_s"] <= 5 for r in live), live
    assert all(r["join_s"] <= 15 or r.get("join_cut_short_by") == "hang" for r in live), live
    assert res["ledger_exact"] and res["tokens"]["duplicated"] == res["tokens"]["skipped"] == 0
    assert_same_model(res)
    assert res["false_incidents"] == [] and res["completed_steps"] == 100
    assert "token ledger exact" in stdout and "verdict: PASS" in stdout


@pytest.mark.slow
def test_the_live_drill_never_stops_the_surviving_replicas(tmp_path: Path, cache: Path) -> None:
    """Three replicas, three node faults, each repaired live (the targets are the drill's own:
    survivors' stall <= 5 s, the spare's join <= 15 s, no survivor restarted, no checkpoint
    read, the ledger exact)."""
    code, res, _ = demo("live", tmp_path, cache)
    assert code == 0 and res["verdict"] == "pass", why(res, tmp_path / "out")
    assert [r["path"] for r in res["repairs"]] == ["live"] * 3
    assert all(r["checkpoint_reads"] == r["survivors_restarted"] == 0 for r in res["repairs"])
    assert res["ledger_exact"]
    assert_same_model(res)


@pytest.mark.slow
def test_hangs_that_silence_the_ranks_own_watchdog_are_seen_from_outside(
    tmp_path: Path, cache: Path
) -> None:
    """A rank stopped with SIGSTOP, then another spinning in a C call that holds the GIL: its
    node's agent reports each from its beacon with the process state, the hang playbook takes
    the agent's word for the culprit, and each is detected within the watchdog timeout + 10 s
    and resumed within 5 s (the drill's own targets), bit-identical."""
    code, res, _ = demo("hidden_hang", tmp_path, cache)
    assert code == 0 and res["verdict"] == "pass", why(res, tmp_path / "out")
    assert [f["target"] for f in res["faults"]] == ["rank-3", "rank-1"]
    assert all(f["repaired"] and all(t["met"] for t in f["targets"]) for f in res["faults"])
    assert res["evicted_nodes"] == ["node-0", "node-1"] and res["false_incidents"] == []
    assert res["bit_identical"] and res["ledger_exact"]
    db = sqlite3.connect(tmp_path / "out" / "coordinator" / "coordinator.db")
    seen = db.execute(
        "SELECT rank, json_extract(payload, '$.process_state'), json_extract(payload, "
        "'$.cpu_share') FROM events WHERE kind = 'rank.hang' AND json_extract(payload, "
        "'$.observer') = 'agent' ORDER BY ts"
    ).fetchall()
    assert [(rank, state) for rank, state, _ in seen] == [(3, "T (stopped)"), (1, "R (running)")]
    assert seen[0][2] == 0.0 and seen[1][2] >= 0.5  # the spinning rank holds a core
    found = db.execute(
        "SELECT json_extract(result, '$.verdict'), json_extract(result, '$.culprit_nodes') "
        "FROM actions WHERE action = 'fr_dump' ORDER BY rowid"
    ).fetchall()
    assert [json.loads(nodes) for _, nodes in found] == [["node-1"], ["node-0"]]
    # A stopped rank gives no dump: only the agent's word names it. The spinning rank's
    # GIL-free dump (below) may reach the analysis before its agent's report does, and the
    # analysis then names it as a hang: either way the culprit is found without the deadline.
    assert found[0][0] == "seen hung from outside"
    assert found[1][0] in ("seen hung from outside", "hang")
    # Each repair kept its evidence first: the culprit node's own, every rank's stacks and the
    # dumps of the ranks that could write one, sealed whole.
    bundles = db.execute("SELECT manifest FROM bundles ORDER BY incident_id").fetchall()
    kept = [json.loads(m) for (m,) in bundles]
    assert [m["missing"] for m in kept] == [{}, {}]
    assert [sorted(n for n in m["files"] if n.startswith("nodes/")) for m in kept] == [
        ["nodes/node-1.json"],
        ["nodes/node-0.json"],
    ]
    assert all("stacks.json" in m["files"] and m["capture_s"] <= 10 for m in kept)
    # The rank holding the GIL still gave its flight recorder (without stacks), through its
    # GIL-free helper: the last dump of rank 1, whose process was killed in the GIL's hold.
    dumps = load_dir(tmp_path / "out" / "fr")
    assert dumps.sidecars[1]["reason"] == "fr.dump without the GIL (native)"
    assert dumps.summaries[1].entries > 0 and not dumps.unreadable


@pytest.mark.slow
def test_a_fault_in_the_last_replica_holding_the_model_restarts_every_replica(
    tmp_path: Path, cache: Path
) -> None:
    """Replica 1 is repaired live; replica 0, the only one holding the model, is struck before
    the spare has healed from it: the second repair is a warm restart from a checkpoint, not a
    rejoin of both replicas with nothing to heal from (which trained on from a reset model
    under an exact ledger)."""
    code, res, _ = demo("live_overlap", tmp_path, cache)
    assert code == 0 and res["verdict"] == "pass", why(res, tmp_path / "out")
    assert [r["path"] for r in res["repairs"]] == ["live", "warm_restart"]
    live, warm = res["repairs"]
    assert live["checkpoint_reads"] == live["survivors_restarted"] == 0
    assert warm["checkpoint_reads"] > 0
    assert res["ledger_exact"]
    assert_same_model(res)


@pytest.mark.slow
def test_an_eviction_with_no_spare_fails_and_says_why(tmp_path: Path, cache: Path) -> None:
    """The double-bit ECC drill with no spare node: the eviction is refused and escalated, and
    training goes on on the faulty node. Detected but not repaired: a FAIL, exit 1, warned
    before the run and explained first, in the terminal and in the report."""
    spec = tmp_path / "ecc_no_spare.yaml"
    doc = (Path(__file__).parent.parent / "scenarios" / "ecc_dbe.yaml").read_text()
    spec.write_text(doc.replace("spares: 1", "spares: 0"))
    code, res, stdout = demo(str(spec), tmp_path, cache)
    assert code == 1 and res["verdict"] == "fail"
    (fault,) = res["faults"]
    assert fault["detected"] and not fault["repaired"] and res["evicted_nodes"] == []
    assert "evict_node escalated" in fault["repair_problem"]
    assert res["problems"][0].startswith("ecc_dbe on node-1: not repaired")
    assert res["warnings"] and "fleet has 0" in res["warnings"][0]
    lines = stdout.splitlines()
    assert "WARNING: 1 fault needs a spare node" in stdout
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith("verdict: FAIL"))
    assert lines[verdict + 1].startswith("  FAIL: ecc_dbe on node-1: not repaired")
    report = (tmp_path / "out" / "report.html").read_text()
    assert report.index('id="problems"') < report.index('id="what-happened"')


@pytest.mark.slow
def test_sdc_is_rolled_back_before_it_and_its_node_returns_only_once_repaired(
    tmp_path: Path, cache: Path
) -> None:
    """The validation drill, run under a pseudo-terminal as a user watching it would: the
    training steps as a live bar with an ETA, the timeline's incidents printed above it, the
    same lines saved in the run directory. Its fault is the SDC drill's (`scenarios/sdc.yaml` is
    this scenario without the returns): the spot check finds the corruption and the run rolls
    back to before it. The repair evicts node-1, whose GPU stays damaged; the operator's first
    return (POST /v1/actions, operator token) is refused by the validation burn-in with the
    reason, the second, after the repair, returns it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    env["SENTINEL_DEMO_CACHE"] = str(cache)
    result = tmp_path / "result.json"
    argv = [*SENTINEL, "demo", "--scenario", "validation", "--quick", "--out",
            str(tmp_path / "out"), "--json", str(result)]  # fmt: skip
    code, drawn = run_in_pty(argv, timeout_s=420, env=env)
    text = ANSI.sub("", drawn)
    assert code == 0, text[-3000:]
    res = json.loads(result.read_text())
    assert res["verdict"] == "pass", why(res, tmp_path / "out")
    assert_repaired(res, "sdc", "sdc", ["node-1"])
    (fault,) = res["faults"]
    assert fault["target"] == "rank-2" and fault["struck_node"] == "node-1"
    # The fault strikes at loop index 12 (step 13); the drill's spot check runs every 25 steps.
    assert fault["injected_step"] == 13 and fault["detected_step"] == 26
    assert fault["actions"][0] == "sdc_recompute" and res["incidents"][0]["target"] == "node-1"
    log = (tmp_path / "out" / "supervisor.log").read_text()
    assert "launching generation 1 on ['node-0', 'spare-0']" in log
    # No check had passed since the corruption could have begun (the first ran at step 25,
    # after it): no checkpoint can be trusted, so the run starts over from its first step.
    assert '"resume_before_step": 0' in log
    assert "step    1  loss 4.8457 (replayed after rollback)" in text
    # --quick keeps all 40 steps: the repair is proven only after the spot check at 25 and the
    # recompute at the exchange after it
    assert res["completed_steps"] == 40
    assert ANSI.search(drawn) and "demo training" in text and "40/40" in text
    assert "eta" in text and "?? incident #1" in text and "replaying after a rollback" in text
    assert "incident #1" in (tmp_path / "out" / "timeline.jsonl").read_text()
    r = res["returns"]
    first, second = r["attempts"]
    assert first["still_damaged"] and first["outcome"] == "refused"
    assert "failed validation: sdc: GPU 0" in first["reason"] and first["reason"] in text
    assert not second["still_damaged"] and second["outcome"] == "returned"
    assert r["refused_while_damaged"] and r["returned_after_repair"] and not r["false_return"]
    assert "verdict: PASS" in text
    report = (tmp_path / "out" / "report.html").read_text()
    assert "Validation before return of node-1" in report and "no false return" in report
