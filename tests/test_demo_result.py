"""The drill report's grading: faults matched to incidents by where they struck, false
incidents, the bit-identity rule, and the goodput input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentinel.lab.demo.account import time_account
from sentinel.lab.demo.result import (
    Evidence,
    Generation,
    Strike,
    Timing,
    build_result,
    goodput_input,
)
from sentinel.lab.sim.inject import CheckpointSave, Launch, StepLine
from sentinel.scenario import Scenario

T0 = 1000.0


def scenario(*faults: dict[str, Any], steps: int = 40) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "fleet": {"nodes": 2, "gpus_per_node": 2, "spares": 1},
            "trainer": {"tp": 2, "pp": 1, "dp": 2, "steps": steps, "checkpoint_every": 10},
            "faults": list(faults),
        }
    )


def action(name: str, **result: Any) -> dict[str, Any]:
    return {"action": name, "state": "done", "target": "job:demo", "result": result}


def incident(
    iid: int,
    fault: str,
    t: float,
    events: list[tuple[str, int | None]],
    actions: list[dict[str, Any]],
    target: str = "job:demo",
    first_step: int | None = None,
    run: str = "done",
    rank_kind: str = "rank.hang",
) -> dict[str, Any]:
    """An incident document; events from a rank are rank events (they name their step)."""
    return {
        "id": iid,
        "fault": fault,
        "target": target,
        "opened_at": T0 + t,
        "first_step": first_step,
        "state": "mitigated",
        "playbook": fault,
        "events": [
            {"node": n, "rank": r, "kind": rank_kind if r is not None else "node.health"}
            for n, r in events
        ],
        "actions": actions,
        "runs": [{"status": run}],
    }


# Generation 0 on node-0 and node-1 trains steps 1-20 (one a second); generation 1 replaces
# node-1 with spare-0 at t=40 and trains steps 11-40 from t=41.
GENERATIONS = [Generation(0.0, 0, ("node-0", "node-1")), Generation(40.0, 1, ("node-0", "spare-0"))]


def evidence(
    sc: Scenario,
    incidents: list[dict[str, Any]],
    strikes: dict[int, Strike],
    digest: str = "d",
    reference: str = "d",
    generations: list[Generation] = GENERATIONS,
) -> Evidence:
    steps = [(float(s), s, 0) for s in range(1, 21)] + [(30.0 + s, s, 1) for s in range(11, 41)]
    return Evidence(
        sc,
        T0,
        incidents,
        strikes,
        steps,
        40,
        digest,
        reference,
        generations=generations,
        timing=Timing(agent_interval_s=1.0),
    )


def test_a_hang_blamed_on_the_struck_node_passes_with_measured_times() -> None:
    sc = scenario({"kind": "hang", "rank": 3, "at_step": 15})
    inc = incident(
        1,
        "collective_hang",
        19.0,
        [("node-0", 0), ("node-1", 3)],
        [action("fr_dump"), action("evict_node", nodes=["node-1"]), action("resume")],
    )
    # The coordinator's recorded stages (epochs): the report and the goodput samples read them.
    at = {
        "detected": 18.5,
        "decided": 19.25,
        "drained": 20.0,
        "restart": 21.0,
        "relaunched": 30.0,
        "rendezvoused": 31.0,
        "checkpoint_loaded": 33.0,
        "first_step": 41.0,
    }
    inc["stages"] = [{f"{k}_at": T0 + v for k, v in at.items()}]
    res = build_result(evidence(sc, [inc], {0: Strike(t=15.5, step=15, node="node-1", rank=3)}))
    assert res["verdict"] == "pass"
    assert res["incidents"][0]["stages"] == at
    assert res["faults"][0]["repair_stages_s"] == {
        "decide": 0.75,
        "drain": 0.75,
        "prepare": 1.0,
        "relaunch": 9.0,
        "rendezvous": 1.0,
        "checkpoint_load": 2.0,
        "build_first_step": 8.0,
    }
    (f,) = res["faults"]
    assert (f["detected"], f["incident"], f["target"]) == (True, 1, "rank-3")
    assert (f["time_to_detect_s"], f["time_to_resume_s"]) == (3.5, 22.0)
    assert res["evicted_nodes"] == ["node-1"] and res["incidents"][0]["target"] == "node-1"
    # Opened at t=19 with no step in its evidence: step 19 closed at t=19, step 20 in progress.
    assert res["incidents"][0]["detected_step"] == 20
    assert [c["met"] for c in res["faults"][0]["targets"]] == [True, True]  # hang and resume
    assert goodput_input(res) == {
        "time_to_detect_s": {"hang": 3.5},
        "time_to_resume_s": {"hang": 22.0},
    }


def test_evicting_the_wrong_node_is_a_miss_and_a_false_incident() -> None:
    sc = scenario({"kind": "hang", "rank": 3, "at_step": 15})
    inc = incident(
        1, "collective_hang", 19.0, [("node-1", 3)], [action("evict_node", nodes=["node-0"])]
    )
    res = build_result(evidence(sc, [inc], {0: Strike(t=15.5, step=15, node="node-1", rank=3)}))
    assert res["verdict"] == "fail"
    assert not res["faults"][0]["detected"] and res["false_incidents"][0]["id"] == 1


def test_node_fault_needs_a_matching_class_and_an_unexplained_incident_fails() -> None:
    sc = scenario({"kind": "ecc_dbe", "node": "node-1", "gpu": 0, "at_step": 15})
    wrong_class = incident(1, "thermal", 16.0, [("node-1", None)], [], target="node-1")
    res = build_result(evidence(sc, [wrong_class], {0: Strike(t=15.0, step=15, node="node-1")}))
    assert not res["faults"][0]["detected"] and len(res["false_incidents"]) == 1
    right = incident(2, "gpu_hardware", 15.2, [("node-1", None)], [], target="node-1")
    res = build_result(evidence(sc, [right], {0: Strike(t=15.0, step=15, node="node-1")}))
    assert res["verdict"] == "pass" and res["faults"][0]["time_to_detect_s"] == 0.2


def test_bit_identity_is_required_unless_the_learning_rate_was_changed() -> None:
    sc = scenario({"kind": "corrupt_batch", "batch": 25})
    strike = {0: Strike(t=25.0, step=25, node=None)}
    # The hooks number steps from 0: their step 24 is the trainer's step 25.
    spike = incident(
        1,
        "loss_spike",
        26.0,
        [("node-0", 0)],
        [action("rollback")],
        first_step=24,
        rank_kind="rank.anomaly",
    )
    res = build_result(evidence(sc, [spike], strike, digest="a", reference="b"))
    assert res["verdict"] == "fail" and res["bit_identity_required"]
    spike["actions"].append(action("lr_scale", factor=0.5, steps=100))
    res = build_result(evidence(sc, [spike], strike, digest="a", reference="b"))
    assert res["verdict"] == "pass" and not res["bit_identical"]
    replayed = evidence(sc, [spike], strike, digest="a", reference="b")
    replayed.reference_has_lr_scale = True  # the reference replayed the window: must match
    assert build_result(replayed)["verdict"] == "fail"


def test_an_unfinished_run_fails_and_burnin_catches_links() -> None:
    sc = scenario({"kind": "link_degraded", "node": "node-1", "factor": 0.25}, steps=50)
    ev = evidence(sc, [], {})
    ev.burnin_exclude = ["node-1"]
    res = build_result(ev)  # 40 of 50 steps
    assert res["verdict"] == "fail" and res["faults"][0]["detected"]
    assert res["faults"][0]["actions"] == ["burnin.exclude"]


def test_an_incident_before_the_strike_explains_nothing() -> None:
    sc = scenario({"kind": "corrupt_batch", "batch": 25})
    early = incident(1, "loss_spike", 10.0, [("node-0", 0)], [action("rollback")])
    res = build_result(evidence(sc, [early], {0: Strike(t=25.0, step=25, node=None)}))
    assert not res["faults"][0]["detected"] and res["false_incidents"][0]["id"] == 1


def test_an_escalated_repair_fails_and_says_why() -> None:
    """No spare: the eviction was refused and escalated, and training went on on the faulty
    node. Detected, but not repaired: the drill fails, and its first problem says why."""
    sc = scenario({"kind": "ecc_dbe", "node": "node-1", "gpu": 0, "at_step": 15})
    refused = {
        "action": "evict_node",
        "state": "escalated",
        "target": "node-1",
        "result": {"node": "node-1", "reason": "no hot spare left"},
    }
    inc = incident(
        1, "gpu_hardware", 15.5, [("node-1", None)], [refused], target="node-1", run="escalated"
    )
    one_gen = [Generation(0.0, 0, ("node-0", "node-1"))]
    steps = [(float(s), s, 0) for s in range(1, 41)]
    ev = evidence(sc, [inc], {0: Strike(t=15.0, step=16, node="node-1")}, generations=one_gen)
    ev.steps = steps
    res = build_result(ev)
    (f,) = res["faults"]
    assert res["verdict"] == "fail" and f["detected"] and not f["repaired"]
    assert f["repair_problem"] == (
        "playbook gpu_hardware escalated (evict_node escalated: no hot spare left)"
    )
    assert res["problems"][0].startswith("ecc_dbe on node-1: not repaired: playbook")


def test_a_struck_node_that_trains_after_the_repair_is_not_repaired() -> None:
    sc = scenario({"kind": "ecc_dbe", "node": "node-1", "gpu": 0, "at_step": 15})
    inc = incident(1, "gpu_hardware", 15.5, [("node-1", None)], [action("resume")], target="node-1")
    same_nodes = [
        Generation(0.0, 0, ("node-0", "node-1")),
        Generation(40.0, 1, ("node-0", "node-1")),
    ]
    res = build_result(
        evidence(sc, [inc], {0: Strike(t=15.0, step=16, node="node-1")}, generations=same_nodes)
    )
    assert res["verdict"] == "fail"
    assert (
        res["faults"][0]["repair_problem"] == "node-1 still trained after the repair (generation 1)"
    )


def test_time_targets_are_checked_not_only_printed() -> None:
    """Detected 1.5 s after the injection with agents sweeping every second, resumed 25.5 s
    after: the detection target is missed, with its figure, and the drill fails."""
    sc = scenario({"kind": "ecc_dbe", "node": "node-1", "gpu": 0, "at_step": 15})
    inc = incident(1, "gpu_hardware", 15.5, [("node-1", None)], [action("resume")], target="node-1")
    res = build_result(evidence(sc, [inc], {0: Strike(t=14.0, step=15, node="node-1")}))
    (f,) = res["faults"]
    assert f["repaired"] and [(c["target"], c["value"], c["met"]) for c in f["targets"]] == [
        ("detected within one agent interval", 1.5, False),
        ("resumed within 60 s of detection", 25.5, True),
    ]
    assert res["verdict"] == "fail"
    assert res["problems"] == [
        "ecc_dbe on node-1: missed 'detected within one agent interval' (limit 1.0 s, got 1.5 s)"
    ]


def test_the_time_account_puts_every_second_in_one_category() -> None:
    """Generation 0 starts at t=2 and trains steps 1-12 one a second from t=5; a save after
    step 10 holds training 0.5 s; the gang hangs after step 12 (t=17) and the hang is detected
    at t=27; generation 1 is launched at t=30, its code runs from t=32, rendezvous 1 s,
    checkpoint load 2 s, first step at t=36; it replays steps 11-20 (t=37-46)."""
    gen0 = [StepLine(t=5.0 + s, step=s, loss=1.0, batch=s, step_s=1.0) for s in range(1, 13)]
    gen1 = [StepLine(t=26.0 + s, step=s, loss=1.0, batch=s, step_s=1.0) for s in range(11, 21)]
    lines = [(ln, 0) for ln in gen0] + [(ln, 1) for ln in gen1]
    launches = [
        Launch(main_t=3.0, rendezvous_s=0.5, load_s=0.0, ready_t=5.0, resume_step=0),
        Launch(main_t=32.0, rendezvous_s=1.0, load_s=2.0, ready_t=36.0, resume_step=10),
    ]
    saves = [CheckpointSave(t=15.0, step=10, held_s=0.5)]
    got = time_account(lines, [(2.0, 0), (30.0, 1)], launches, saves, [27.0], None)
    assert got["wall_s"] == 46.0
    assert got["seconds"] == {
        "productive": 20.0,
        "rollback": 1.5,
        "detection": 10.0,
        "repair": 9.0,
        "checkpoint": 0.5,
        "burnin": 0.0,
        "startup": 5.0,
    }
    assert got["repair_stages_s"] == {
        "stop": 3.0,
        "relaunch": 2.0,
        "rendezvous": 1.0,
        "checkpoint_load": 2.0,
        "build": 1.0,
    }
    assert abs(sum(got["seconds"].values()) - got["wall_s"]) <= 0.01 * got["wall_s"]
    assert got["effective_ratio"] == round(20.0 / 46.0, 4)


def test_drills_run_the_shipped_hooks_defaults_compressed_by_one_factor() -> None:
    """The demo cannot import trainer_hooks: its copy of the shipped defaults must match them,
    and the drill's settings are exactly those divided by the one compression factor."""
    from sentinel.lab.demo.run import (
        DRILL_COMPRESSION,
        SHIPPED_HOOKS_SECONDS,
        SHIPPED_HOOKS_STEPS,
        drill_hooks,
        hooks_env,
    )
    from trainer_hooks.config import HooksConfig

    shipped = HooksConfig()
    for name, value in {**SHIPPED_HOOKS_STEPS, **SHIPPED_HOOKS_SECONDS}.items():
        assert getattr(shipped, name) == value, name
    drill = HooksConfig.from_env(hooks_env(Path("/tmp/out")))
    for name, value in SHIPPED_HOOKS_SECONDS.items():
        assert getattr(drill, name) == value / DRILL_COMPRESSION
    assert drill.exchange_every == drill.straggler_window == 5 and drill.sdc_every == 25
    assert drill.straggler_threshold == shipped.straggler_threshold
    assert drill.hang_k == shipped.hang_k and drill.anomaly_policy == shipped.anomaly_policy
    assert set(drill_hooks()) == set(SHIPPED_HOOKS_STEPS) | set(SHIPPED_HOOKS_SECONDS)


def test_a_poison_crash_is_handled_when_the_budget_stops_the_job_and_no_node_is_taken() -> None:
    """A crash that recurs at step 16: three restarts (rank_crash, mitigated), then the fourth
    incident escalated by the restart budget. The run stopped early with no final model, and
    that is the expected end: PASS. Had a playbook evicted the node, it would fail, saying so."""
    sc = scenario({"kind": "crash", "rank": 1, "at_step": 15, "recurs": True})
    restarts = [
        incident(
            i,
            "rank_crash",
            15.5 + 10 * i,
            [("node-0", 1)],
            [action("rollback"), action("resume")],
            rank_kind="rank.crash",
        )
        for i in range(1, 4)
    ]
    spent = {
        "action": "resume",
        "state": "escalated",
        "target": "job:demo",
        "result": {
            "error": "restart budget spent: 3 restart(s) for rank_crash since "
            "checkpoint step 10, no checkpoint committed since"
        },
    }
    last = incident(
        4,
        "rank_crash",
        45.5,
        [("node-0", 1)],
        [action("rollback"), spent],
        run="escalated",
        rank_kind="rank.crash",
    )
    last["state"] = "escalated"
    strike = {0: Strike(t=15.0, step=16, node="node-0", rank=1)}
    ev = evidence(sc, [*restarts, last], strike, digest=None, reference=None)  # type: ignore[arg-type]
    ev.completed_steps = 15
    res = build_result(ev)
    (f,) = res["faults"]
    assert res["verdict"] == "pass", res["problems"]
    assert f["repaired"] and res["false_incidents"] == [] and not res["bit_identity_required"]
    evict = {
        "action": "evict_node",
        "state": "done",
        "target": "job:demo",
        "result": {"nodes": ["node-0"]},
    }
    restarts[1]["actions"].insert(0, evict)
    res = build_result(evidence(sc, [*restarts, last], strike, digest=None, reference=None))  # type: ignore[arg-type]
    assert res["verdict"] == "fail"
    assert res["faults"][0]["repair_problem"] == (
        "evicted node-0 for a crash that follows the step, not the node"
    )


def _returns_evidence(attempts: list[dict[str, Any]]) -> Evidence:
    """An SDC evicting node-1, then the operator's returns with what each came to."""
    sc = Scenario.model_validate(
        scenario({"kind": "sdc", "rank": 2, "at_step": 12}).model_dump()
        | {"returns": {"node": "node-1", "gpu": 0}}
    )
    inc = incident(
        1,
        "sdc",
        16.0,
        [("node-1", 2)],
        [action("evict_node", nodes=["node-1"])],
        rank_kind="rank.sdc",
    )
    # The operator's return_node steps run as manual runs on the same incident: they are not
    # the playbook's run, which is what the fault's repair is graded on.
    inc["runs"] = [
        {"id": 1, "playbook": "sdc", "status": "done"},
        {"id": 2, "playbook": "manual", "status": "escalated"},
    ]
    inc["actions"] += [
        {
            "action": "return_node",
            "state": "escalated",
            "run_id": 2,
            "target": "node-1",
            "result": {},
        }
    ]
    ev = evidence(sc, [inc], {0: Strike(13.0, 13, "node-1", 2)})
    ev.returns = {"node": "node-1", "damage": ["sdc"], "incident": 1, "attempts": attempts}
    return ev


def _attempt(damaged: bool, outcome: str | None, reason: str = "") -> dict[str, Any]:
    return {
        "asked_t": 20.0,
        "still_damaged": damaged,
        "outcome": outcome,
        "reason": reason,
        "answered_t": None if outcome is None else 30.0,
        "checks": [],
    }


FAILED = "node-1 stays out of service: it failed validation: sdc: GPU 0: recompute differs"


def test_validation_before_return_passes_only_when_refused_then_returned() -> None:
    res = build_result(
        _returns_evidence([_attempt(True, "refused", FAILED), _attempt(False, "returned")])
    )
    assert res["verdict"] == "pass", res["problems"]
    r = res["returns"]
    assert r["refused_while_damaged"] and r["returned_after_repair"] and not r["false_return"]
    assert r["refused_reason"] == FAILED
    assert res["faults"][0]["repaired"] and "return_node" not in res["faults"][0]["actions"]

    # a damaged node returned: a false return, whatever follows
    res = build_result(_returns_evidence([_attempt(True, "returned")]))
    assert res["verdict"] == "fail" and res["returns"]["false_return"]
    assert "FALSE RETURN" in res["problems"][-1]
    # refused, but not by validation (its agent never held the hold-down): a miss, with why
    why = "node-1 stays out of service: its agent was not healthy for 75 s in a row"
    res = build_result(_returns_evidence([_attempt(True, "refused", why)]))
    assert res["verdict"] == "fail" and not res["returns"]["refused_while_damaged"]
    assert "not refused by validation (refused: " + why in res["problems"][-1]
    # refused by validation, but the repaired node did not come back
    res = build_result(
        _returns_evidence([_attempt(True, "refused", FAILED), _attempt(False, None)])
    )
    assert res["problems"] == [
        "validation before return of node-1: the repaired node was not returned (no answer)"
    ]
    # the operator never asked
    res = build_result(_returns_evidence([]))
    assert "never asked" in res["problems"][-1]


def test_the_struck_node_may_train_until_its_repair_drains_it() -> None:
    """A repair that waits for a checkpoint first keeps the node training; a restart that another
    incident's repair makes meanwhile takes it along. Only a generation after the drain counts."""
    sc = scenario({"kind": "thermal", "node": "node-1", "gpu": 0, "at_step": 15, "temp_c": 92})
    inc = incident(1, "thermal", 15.5, [("node-1", None)], [action("resume")], target="node-1")
    inc["stages"] = [{"drained_at": T0 + 35.0}]
    gens = [
        Generation(0.0, 0, ("node-0", "node-1")),
        Generation(25.0, 1, ("node-0", "node-1")),  # another repair's restart, before the drain
        Generation(40.0, 2, ("node-0", "spare-0")),
    ]
    strikes = {0: Strike(t=15.0, step=16, node="node-1")}
    res = build_result(evidence(sc, [inc], strikes, generations=gens))
    assert res["faults"][0]["repair_problem"] is None
    gens.append(Generation(45.0, 3, ("node-0", "node-1")))
    res = build_result(evidence(sc, [inc], strikes, generations=gens))
    assert res["faults"][0]["repair_problem"] == (
        "node-1 still trained after the repair (generation 3)"
    )
    # ...unless the supervisor took that restart before the drain: it launches on the nodes it
    # was given, and this repair's own restart follows
    ev = evidence(sc, [inc], strikes, generations=gens)
    ev.repairs = [{"generation": 3, "at": 34.0, "path": "warm_restart", "incident": 2}]
    assert build_result(ev)["faults"][0]["repair_problem"] is None
    ev.repairs = [{"generation": 3, "at": 36.0, "path": "warm_restart", "incident": 2}]
    assert "still trained" in build_result(ev)["faults"][0]["repair_problem"]


def test_a_live_rejoin_of_another_replica_does_not_run_the_struck_node_again() -> None:
    """A live repair's generation starts only its rejoining replica's nodes: the struck node is
    in the job's node list (its replica ran on until its own repair) but was not launched."""
    sc = scenario({"kind": "thermal", "node": "node-1", "gpu": 0, "at_step": 15, "temp_c": 92})
    inc = incident(1, "thermal", 15.5, [("node-1", None)], [action("resume")], target="node-1")
    strikes = {0: Strike(t=15.0, step=16, node="node-1")}
    gens = [
        Generation(0.0, 0, ("node-0", "node-1")),
        Generation(16.0, 1, ("spare-0", "node-1"), launched=("spare-0",)),  # replica 0 rejoins
        Generation(20.0, 2, ("spare-0", "spare-1")),
    ]
    res = build_result(evidence(sc, [inc], strikes, generations=gens))
    assert res["faults"][0]["repair_problem"] is None
    gens[1] = Generation(16.0, 1, ("spare-0", "node-1"), launched=("spare-0", "node-1"))
    res = build_result(evidence(sc, [inc], strikes, generations=gens))
    assert res["faults"][0]["repair_problem"] == (
        "node-1 still trained after the repair (generation 1)"
    )
