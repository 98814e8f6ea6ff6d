"""The scheduler bridge's judgement, without processes: which of the scheduler's node states
disagree with Sentinel's, the events that makes (one per disagreement, the same id on every poll
until the node's state moves), and that no sender but an administrator may report them."""

from __future__ import annotations

from sentinel.coordinator.core.auth import Principal, Role
from sentinel.coordinator.core.effects import SchedulerNode
from sentinel.coordinator.core.rows import NodeRow
from sentinel.coordinator.core.scheduler import disagreements, drain_reason
from sentinel.coordinator.core.states import NodeState
from sentinel.protocol import EventKind

DRAINED = SchedulerNode("IDLE+DRAIN", "fan replacement [admin@2026-11-29T10:00:00]", True)
IDLE = SchedulerNode("IDLE", "", False)


def _node(name: str, state: NodeState, changed: float = 100.0) -> NodeRow:
    return NodeRow(name, 100.0, "healthy", state, changed, None)


def test_a_drain_by_someone_else_and_a_return_without_validation_are_the_disagreements() -> None:
    nodes = [
        _node("n-active", NodeState.ACTIVE),
        _node("n-spare", NodeState.SPARE),
        _node("n-returned", NodeState.RETURNED),
        _node("n-ours", NodeState.EVICTED),  # Sentinel drained it: the scheduler agrees
        _node("n-resumed", NodeState.EVICTED),  # someone resumed it
        _node("n-draining", NodeState.DRAINING),  # Sentinel's own moves under way
        _node("n-validating", NodeState.VALIDATING),
        _node("n-unknown", NodeState.ACTIVE),  # not in the scheduler at all
        _node("n-gated", NodeState.ACTIVE),  # the Slurm prolog gate drained it: not ours
    ]
    scheduler = {
        "n-active": DRAINED,
        "n-spare": SchedulerNode("DOWN", "Not responding", True),
        "n-returned": IDLE,
        "n-ours": SchedulerNode(
            "IDLE+DRAIN", drain_reason(7, "sentinel: GPU hardware fault"), True
        ),
        "n-resumed": IDLE,
        "n-draining": DRAINED,
        "n-validating": SchedulerNode("IDLE+MAINT+RESERVED", "", False),
        "n-gated": SchedulerNode("IDLE+DRAIN", "sentinel: XID 79 (reboot_node)", True),
    }
    events = disagreements(scheduler, nodes, now=200.0)
    seen = {(e.kind, e.source.node) for e in events}
    assert seen == {
        (EventKind.SCHEDULER_DRAIN, "n-active"),
        (EventKind.SCHEDULER_DRAIN, "n-spare"),
        (EventKind.SCHEDULER_DRAIN, "n-gated"),
        (EventKind.SCHEDULER_RESUME, "n-resumed"),
    }
    drain = next(e for e in events if e.source.node == "n-active")
    assert drain.payload.model_dump() == {"state": "IDLE+DRAIN", "reason": DRAINED.reason}  # type: ignore[union-attr]
    # the next poll sees the same: the same ids (ingest keeps one); once the node's state
    # moved, a new disagreement is a new event
    assert [e.id for e in disagreements(scheduler, nodes, now=210.0)] == [e.id for e in events]
    moved = [_node("n-active", NodeState.ACTIVE, changed=300.0)]
    assert disagreements(scheduler, moved, now=310.0)[0].id != drain.id
    # a state Sentinel moved within the last poll is left to the next one: its own drain may
    # not have reached the scheduler yet
    kept_out = [_node("n-resumed", NodeState.EVICTED, changed=305.0)]
    assert disagreements(scheduler, kept_out, now=310.0, settle_s=10.0) == []
    assert len(disagreements(scheduler, kept_out, now=316.0, settle_s=10.0)) == 1


def test_sentinels_drain_reason_names_its_incident_first() -> None:
    assert drain_reason(12, "sentinel: GPU hardware fault") == "sentinel:12 GPU hardware fault"
    assert drain_reason(None, "") == "sentinel:- taken out"


def test_only_an_administrator_may_report_what_the_coordinator_observes() -> None:
    (event,) = disagreements({"n1": DRAINED}, [_node("n1", NodeState.ACTIVE)], now=200.0)
    node = Principal("t1", Role.NODE, node="n1")
    assert "the coordinator's own observation" in (node.may_report(event) or "")
    assert node.may_report_all([event]) is not None
    assert Principal("t2", Role.ADMIN).may_report(event) is None
