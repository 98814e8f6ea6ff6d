"""The drill report's grading: faults matched to incidents by where they struck, false
incidents, the bit-identity rule, and the goodput input."""

from __future__ import annotations

from typing import Any

from sentinel.demo.result import Evidence, Strike, build_result, goodput_input
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


def incident(iid: int, fault: str, t: float, events: list[tuple[str, int | None]],
             actions: list[dict[str, Any]], target: str = "job:demo") -> dict[str, Any]:  # fmt: skip
    return {
        "id": iid, "fault": fault, "target": target, "opened_at": T0 + t, "first_step": None,
        "state": "mitigated", "playbook": fault,
        "events": [{"node": n, "rank": r} for n, r in events],
        "actions": actions, "runs": [{"status": "done"}],
    }  # fmt: skip


def evidence(sc: Scenario, incidents: list[dict[str, Any]], strikes: dict[int, Strike],
             digest: str = "d", reference: str = "d") -> Evidence:  # fmt: skip
    steps = [(float(s), s, 0) for s in range(1, 21)] + [(30.0 + s, s, 1) for s in range(11, 41)]
    return Evidence(sc, T0, incidents, strikes, steps, 40, digest, reference)


def test_a_hang_blamed_on_the_struck_node_passes_with_measured_times() -> None:
    sc = scenario({"kind": "hang", "rank": 3, "at_step": 15})
    inc = incident(1, "collective_hang", 19.0, [("node-0", 0), ("node-1", 3)],
                   [action("fr_dump"), action("evict_node", nodes=["node-1"]), action("resume")])  # fmt: skip
    res = build_result(evidence(sc, [inc], {0: Strike(t=15.5, step=15, node="node-1", rank=3)}))
    assert res["verdict"] == "pass"
    (f,) = res["faults"]
    assert (f["detected"], f["incident"], f["target"]) == (True, 1, "rank-3")
    assert (f["time_to_detect_s"], f["time_to_resume_s"]) == (3.5, 22.0)
    assert res["evicted_nodes"] == ["node-1"] and res["incidents"][0]["target"] == "node-1"
    assert res["incidents"][0]["detected_step"] == 19
    assert goodput_input(res) == {"time_to_detect_s": {"hang": 3.5},
                                  "time_to_resume_s": {"hang": 22.0}}  # fmt: skip


def test_evicting_the_wrong_node_is_a_miss_and_a_false_incident() -> None:
    sc = scenario({"kind": "hang", "rank": 3, "at_step": 15})
    inc = incident(1, "collective_hang", 19.0, [("node-1", 3)],
                   [action("evict_node", nodes=["node-0"])])  # fmt: skip
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
    spike = incident(1, "loss_spike", 26.0, [("node-0", 0)], [action("rollback")])
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
