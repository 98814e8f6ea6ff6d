"""`sentinel demo` end to end on shipped scenarios, shortened with --quick: a real coordinator,
simulated agents, `sentinel run` supervising the reference trainer, faults injected, the drill
report graded against a clean reference run (shared by the tests through one cache)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from demo_checks import SENTINEL, assert_same_model, demo, why
from terminal import ANSI, run_in_pty


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo-reference")


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


@pytest.mark.slow
def test_sdc_is_caught_by_the_spot_check_and_rolled_back_before_it(
    tmp_path: Path, cache: Path
) -> None:
    """The SDC drill, run under a pseudo-terminal as a user watching it would: the training
    steps as a live bar with an ETA, the timeline's incidents printed above it, the same lines
    saved in the run directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    env["SENTINEL_DEMO_CACHE"] = str(cache)
    result = tmp_path / "result.json"
    argv = [*SENTINEL, "demo", "--scenario", "sdc", "--quick", "--out", str(tmp_path / "out"),
            "--json", str(result)]  # fmt: skip
    code, drawn = run_in_pty(argv, timeout_s=420, env=env)
    text = ANSI.sub("", drawn)
    assert code == 0, text[-3000:]
    res = json.loads(result.read_text())
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
    assert "verdict: PASS" in text
    timeline = (tmp_path / "out" / "timeline.jsonl").read_text()
    assert "incident #1" in timeline


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
    # windows: --quick keeps the steps those need (55 of 60).
    code, res, _ = demo("straggler", tmp_path, cache)
    assert code == 0
    assert_repaired(res, "straggler", "straggler", ["node-0"])
    assert res["faults"][0]["struck_node"] == "node-0"


@pytest.mark.slow
def test_the_live_drill_never_stops_the_surviving_replicas(tmp_path: Path, cache: Path) -> None:
    """Three replicas, three node faults, each repaired live (the targets are the drill's own:
    survivors' stall <= 5 s, the spare's join <= 15 s, no survivor restarted, no checkpoint
    read, the ledger exact)."""
    code, res, _ = demo("live", tmp_path, cache)
    assert code == 0 and res["verdict"] == "pass", why(res)
    assert [r["path"] for r in res["repairs"]] == ["live"] * 3
    assert all(r["checkpoint_reads"] == r["survivors_restarted"] == 0 for r in res["repairs"])
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
def test_validation_keeps_a_damaged_node_out_and_returns_it_once_repaired(
    tmp_path: Path, cache: Path
) -> None:
    """The validation drill as a demo scenario: the SDC's repair evicts node-1, whose GPU stays
    damaged; the operator's first return (POST /v1/actions, operator token) is refused by the
    validation burn-in with the reason, the second, after the repair, returns it."""
    code, res, stdout = demo("validation", tmp_path, cache)
    assert code == 0 and res["verdict"] == "pass", why(res)
    assert_repaired(res, "sdc", "sdc", ["node-1"])
    r = res["returns"]
    first, second = r["attempts"]
    assert first["still_damaged"] and first["outcome"] == "refused"
    assert "failed validation: sdc: GPU 0" in first["reason"] and first["reason"] in stdout
    assert not second["still_damaged"] and second["outcome"] == "returned"
    assert r["refused_while_damaged"] and r["returned_after_repair"] and not r["false_return"]
    report = (tmp_path / "out" / "report.html").read_text()
    assert "Validation before return of node-1" in report and "no false return" in report
