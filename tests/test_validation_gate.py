"""Validation before return, without processes: the hold-down read from the coordinator's own
record, the judgement of a node's figures against the baseline, the gate's moves through the
engine on a fake clock (fail -> evicted with the reason; pass -> returned; silence -> out), the
node held for its validation where the scheduler would run nothing and released when it stays
out, and `playbooks check` refusing a return with no baseline, with its file and line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from coord_util import ROOT, cfg, job_status, one, query, xid

from sentinel.burnin.baseline import Measured, ValidationBaseline, judge, save_validation_baseline
from sentinel.config import ValidationConfig
from sentinel.coordinator.backends import make_backend
from sentinel.coordinator.core import operator as queries
from sentinel.coordinator.core.effects import EvictionBackend, EvictionError
from sentinel.coordinator.core.engine import Engine
from sentinel.coordinator.core.ingest import Ingestor
from sentinel.coordinator.core.playbooks import PlaybookError, load_playbooks
from sentinel.coordinator.core.validation import healthy_since
from sentinel.coordinator.store import SqlStore
from sentinel.protocol import (
    AgentHeartbeatPayload,
    EventBatch,
    EventKind,
    NodeValidationPayload,
    Source,
    ValidationCheck,
    Verdict,
    make_event,
)

PLAYBOOKS = load_playbooks(ROOT / "playbooks")
BASE = ValidationBaseline(
    gemm_s=0.002,
    gemm_size=384,
    loopback_gbps=1.0,
    loopback_bytes=1 << 24,
    sdc_digest="abc",
    device="cpu",
)
H, U = Verdict.HEALTHY.value, Verdict.UNHEALTHY.value


def test_healthy_since_needs_an_unbroken_healthy_record_up_to_now() -> None:
    beats = [(t, H) for t in range(0, 100, 10)]  # every 10 s, last at 90
    assert healthy_since(beats, 95, stale_s=30) == 0
    assert healthy_since(beats, 130, stale_s=30) is None  # silent for 40 s: not healthy now
    assert healthy_since([*beats[:3], (25, U), *beats[3:]], 95, 30) == 30  # restarts after it
    assert healthy_since([(0, H), (50, H), (60, H)], 65, 30) == 50  # a 50 s silence breaks it
    assert healthy_since([], 10, 30) is None  # never heard from: never healthy
    assert healthy_since([(0, H), (5, U)], 6, 30) is None


def test_judge_names_each_failed_check_with_its_figures() -> None:
    good = Measured("cpu", [0.0021, 0.0019], [("abc", "abc")] * 2, 0.9)
    assert all(c.passed for c in judge(good, BASE))
    slow = Measured("cpu", [0.0021, 0.0031], [("abc", "abc")] * 2, 0.9)
    gemm = judge(slow, BASE)[0]
    assert (
        not gemm.passed
        and gemm.value == 0.0031
        and gemm.detail.startswith("GPU 1: 384^3 GEMM in 3.10 ms")
    )
    flipped = Measured("cpu", [0.002], [("abc", "abd")], 0.9)
    assert "recompute differs from itself" in judge(flipped, BASE)[1].detail
    other = Measured("cpu", [0.002], [("abd", "abd")], 0.9)  # agrees with itself, not the fleet
    assert not judge(other, BASE)[1].passed
    assert judge(Measured("H100", [0.002], [("zzz", "zzz")], 0.9), BASE)[1].passed  # other model
    assert not judge(Measured("cpu", [0.002], [("abc", "abc")], 0.4), BASE)[2].passed
    broken = Measured("cpu", errors=["GPU 0: CUDA error: device reported Xid 79"])
    assert [c.passed for c in judge(broken, BASE)] == [False, False, False]


def test_a_cpu_devices_gemm_is_judged_by_its_ratio_to_the_host() -> None:
    """A CPU device's time moves with the host's load; its ratio to the host's time in the same
    rounds does not. A baseline with that ratio judges the ratio, whatever the absolute time."""
    paired = BASE.model_copy(update={"gemm_vs_host": 1.0})
    digests = [("abc", "abc")] * 2
    loaded = Measured("cpu", [0.006, 0.006], digests, 0.9, gemm_vs_host=[1.01, 1.02])
    assert judge(loaded, paired)[0].passed  # 3x the baseline's time, as the host is
    slow = Measured("cpu", [0.0025, 0.002], digests, 0.9, gemm_vs_host=[1.25, 1.0])
    gemm = judge(slow, paired)[0]
    assert not gemm.passed and (gemm.value, gemm.baseline, gemm.limit) == (1.25, 1.0, 1.2)
    assert gemm.detail.startswith("GPU 0: 384^3 GEMM in 1.250x the host's time")
    on_gpu = Measured("H100", [0.0025, 0.002], digests, 0.9)  # no ratio: its own time is judged
    assert judge(on_gpu, paired)[0].value == 0.0025


def test_playbooks_check_refuses_a_return_with_no_baseline_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "ret.yaml").write_text(
        "name: back\nincident: {fault: repaired, scope: node}\ntrigger:\n"
        "  - kinds: [node.health]\nsteps:\n  - {action: notify}\n"
        "  - action: return_node\n    params: {node: node-1}\n"
    )
    with pytest.raises(PlaybookError) as e:
        load_playbooks(tmp_path)
    assert e.value.errors[0].startswith(f"{tmp_path / 'ret.yaml'}:7: steps.1: return_node")
    assert "no baseline" in e.value.errors[0]
    good = tmp_path / "base.json"
    save_validation_baseline(good, BASE)
    assert load_playbooks(tmp_path, good)[0].name == "back"
    with pytest.raises(
        PlaybookError, match=r"ret.yaml:7: steps.1: .*nope.json: cannot read.*validation baseline"
    ):
        load_playbooks(tmp_path, tmp_path / "nope.json")


class _Clock:
    t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _beat(node: str, verdict: Verdict = Verdict.HEALTHY) -> object:
    payload = AgentHeartbeatPayload(gpus=2, verdict=verdict, agent_version="t")
    return make_event(EventKind.AGENT_HEARTBEAT, Source(node=node), payload)


def _answer(node: str, rid: str, passed: bool, why: str = "") -> object:
    check = ValidationCheck(name="sdc", passed=passed, detail=why or "agrees")
    payload = NodeValidationPayload(request_id=rid, passed=passed, checks=[check], reason=why)
    return make_event(EventKind.NODE_VALIDATION, Source(node=node), payload)


def test_the_gate_keeps_a_failing_node_out_and_returns_a_passing_one(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    """node-1 is evicted (an XID). Asked to return: validating, waiting out a 60 s hold-down of
    heartbeats (an unhealthy one restarts it), then a node.validate command; a failed answer
    sends it back to evicted with the reason. Asked again with a passing answer: returned."""
    base = tmp_path / "base.json"
    save_validation_baseline(base, BASE)
    c = cfg(tmp_path, validation=ValidationConfig(baseline=base, hold_down_s=60, stale_s=20))
    store, clock = new_store(), _Clock()
    ingest, engine = (
        Ingestor(store, PLAYBOOKS, c),
        Engine(store, PLAYBOOKS, c, make_backend(c), clock),
    )

    def feed(*events: object) -> None:
        ingest.ingest(EventBatch(events=list(events)), clock())  # type: ignore[arg-type]

    def state() -> str:
        return str(one(store, "SELECT state FROM nodes WHERE name='node-1'")["state"])  # type: ignore[index]

    feed(job_status("j", ["node-0", "node-1"], ["spare-0"]), xid("node-1", ts=clock()))
    engine.tick()
    assert state() == "evicted"
    incident = query(store, "SELECT id FROM incidents")[-1]["id"]

    def ask(why: str) -> None:
        queries.run_action(
            store,
            c.dry_run,
            incident,
            "return_node",
            {"node": "node-1"},
            why,
            "operator:o",
            clock(),
        )
        engine.tick()

    def commands() -> list[str]:
        rows = query(store, "SELECT id FROM commands WHERE kind='node.validate' ORDER BY id")
        return [r["id"] for r in rows]

    ask("reseated")
    assert state() == "validating" and commands() == []  # never heard from: no hold-down yet
    for step in range(8):  # 10 s apart; the third is unhealthy: the hold-down starts over
        clock.t += 10
        feed(_beat("node-1", Verdict.UNHEALTHY if step == 2 else Verdict.HEALTHY))
        engine.tick()
        assert commands() == []
    for _ in range(2):
        clock.t += 10
        feed(_beat("node-1"))
        engine.tick()
    (rid,) = commands()  # healthy for 60 s since the unhealthy beat: validate now
    feed(_answer("node-1", rid, False, "sdc: GPU 0: recompute differs from itself"))
    engine.tick()
    assert state() == "evicted"
    (held,) = query(store, "SELECT result FROM actions WHERE state='escalated'")
    assert held["result"]["reason"] == (
        "node-1 stays out of service: it failed validation:"
        " sdc: GPU 0: recompute differs from itself"
    )
    node = store.node("node-1")
    assert node is not None and "failed validation" in (node.reason or "")

    clock.t += 1
    ask("GPU replaced")
    clock.t += 10
    feed(_beat("node-1"))
    engine.tick()
    rid2 = commands()[-1]
    assert rid2 != rid  # a new entry into validating asks afresh
    feed(_answer("node-1", rid2, True))
    engine.tick()
    engine.tick()
    assert state() == "returned"


def test_no_baseline_or_a_silent_agent_keeps_the_node_out(
    tmp_path: Path, new_store: Callable[[], SqlStore]
) -> None:
    base = tmp_path / "base.json"
    save_validation_baseline(base, BASE)
    c = cfg(tmp_path, validation=ValidationConfig(hold_down_s=0, stale_s=20, timeout_s=30))
    store, clock = new_store(), _Clock()
    ingest, engine = (
        Ingestor(store, PLAYBOOKS, c),
        Engine(store, PLAYBOOKS, c, make_backend(c), clock),
    )
    ingest.ingest(
        EventBatch(
            events=[job_status("j", ["node-0", "node-1"], ["spare-0"]), xid("node-1", ts=clock())]
        ),
        clock(),
    )
    engine.tick()
    incident = query(store, "SELECT id FROM incidents")[-1]["id"]
    queries.run_action(
        store, c.dry_run, incident, "return_node", {"node": "node-1"}, "x", "operator:o", clock()
    )
    engine.tick()
    (held,) = query(store, "SELECT result FROM actions WHERE state='escalated'")
    assert held["result"]["reason"].startswith("no validation baseline")
    assert store.node("node-1").state == "evicted"  # type: ignore[union-attr]
    # with a baseline (the step's own) but an agent that never speaks: out after the timeout
    params = {"node": "node-1", "baseline": str(base)}
    queries.run_action(
        store, c.dry_run, incident, "return_node", params, "x", "operator:o", clock()
    )
    engine.tick()
    assert store.node("node-1").state == "validating"  # type: ignore[union-attr]
    clock.t += 31
    engine.tick()
    assert store.node("node-1").state == "evicted"  # type: ignore[union-attr]
    held = query(store, "SELECT result FROM actions WHERE state='escalated'")
    assert any("was not healthy for 0 s in a row" in h["result"]["reason"] for h in held)


class _Scheduler(EvictionBackend):
    """A scheduler that runs nothing on a drained node (as Slurm): the gate holds the node for
    its validation. It records every call; `refuse` makes the hold fail."""

    name = "recording"

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.refuse = refuse

    def evict(self, node: str, reason: str) -> str:
        self.calls.append(("evict", node))
        return f"drained {node}"

    def restore(self, node: str, reason: str) -> str:
        self.calls.append(("restore", node))
        return f"resumed {node}"

    def hold_for_validation(self, node: str) -> tuple[str, dict[str, str]]:
        self.calls.append(("hold", node))
        if self.refuse:
            raise EvictionError("Requested reservation is invalid")
        return f"held {node}", {"reservation": f"validate-{node}"}

    def release_validation(self, node: str, reason: str) -> str:
        self.calls.append(("release", node, reason))
        return f"released {node}"


@pytest.mark.parametrize("refuse", [False, True], ids=["held", "refused"])
def test_the_node_is_held_for_its_validation_and_released_when_it_stays_out(
    tmp_path: Path, new_store: Callable[[], SqlStore], refuse: bool
) -> None:
    """Held before the burn-in is asked for, with the hold's launch details in the command; a
    failed validation (or a hold the scheduler refused) releases the node, and a pass returns
    it through the scheduler with no release."""
    base = tmp_path / "base.json"
    save_validation_baseline(base, BASE)
    c = cfg(tmp_path, validation=ValidationConfig(baseline=base, hold_down_s=0, stale_s=20))
    store, clock, scheduler = new_store(), _Clock(), _Scheduler(refuse)
    ingest, engine = Ingestor(store, PLAYBOOKS, c), Engine(store, PLAYBOOKS, c, scheduler, clock)

    def feed(*events: object) -> None:
        ingest.ingest(EventBatch(events=list(events)), clock())  # type: ignore[arg-type]

    def ask() -> list[dict[str, object]]:
        clock.t += 1
        feed(_beat("node-1"))
        queries.run_action(
            store, False, incident, "return_node", {"node": "node-1"}, "x", "operator:o", clock()
        )
        for _ in range(3):
            engine.tick()
        return query(store, "SELECT id, args FROM commands WHERE kind='node.validate' ORDER BY id")

    feed(job_status("j", ["node-0", "node-1"], ["spare-0"]), xid("node-1", ts=clock()))
    engine.tick()
    incident = query(store, "SELECT id FROM incidents")[-1]["id"]
    asked = ask()
    assert scheduler.calls[:2] == [("evict", "node-1"), ("hold", "node-1")]
    if refuse:  # never asked to validate: out again, released, with the scheduler's word
        assert asked == [] and store.node("node-1").state == "evicted"  # type: ignore[union-attr]
        reason = store.node("node-1").reason or ""  # type: ignore[union-attr]
        assert (
            "could not hold it for its validation" in reason and "reservation is invalid" in reason
        )
        assert scheduler.calls[-1][:2] == ("release", "node-1")
        return
    (command,) = asked
    assert command["args"]["launch"] == {"reservation": "validate-node-1"}  # type: ignore[index]
    feed(_answer("node-1", str(command["id"]), False, "sdc: GPU 0: recompute differs"))
    engine.tick()
    assert store.node("node-1").state == "evicted"  # type: ignore[union-attr]
    release = scheduler.calls[-1]
    assert release[:2] == ("release", "node-1") and release[2].startswith(f"sentinel:{incident} ")

    command = ask()[-1]
    feed(_answer("node-1", str(command["id"]), True))
    engine.tick()
    engine.tick()
    assert store.node("node-1").state == "returned"  # type: ignore[union-attr]
    assert [c[0] for c in scheduler.calls[-2:]] == ["hold", "restore"]
