"""The scheduler bridge: what the scheduler says of each node, against what Sentinel knows.

The coordinator's shell polls the eviction backend for every node's state where the
scheduler looks (`EvictionBackend.scheduler_nodes`; Slurm: `scontrol show node`) every
`coordinator.scheduler_poll_s`. Each poll is compared here with the nodes' states, and two
disagreements become events, ingested like any other, whose playbooks decide what to do:

- `scheduler.drain`: a node Sentinel has in service (active, a job's spare, returned) that the
  scheduler holds out for a reason not Sentinel's (an administrator, a health-check script, a
  prolog). The `scheduler_drain` playbook moves the job off it as off any evicted node, and
  records the node out without draining it again: the scheduler keeps its own reason.
- `scheduler.resume`: a node Sentinel holds out (`evicted`) that the scheduler has back in
  service, though it never passed the validation gate (someone resumed it). The
  `scheduler_resume` playbook tells a person; for Sentinel the node stays evicted, so no job of
  Sentinel's takes it as a spare, until `return_node` validates it.

Nodes between two states (draining, validating) are Sentinel's own moves under way and are left
alone, and so is a node the scheduler does not know. Sentinel's own drains say so in their
reason (`sentinel:<incident> <why>`, `drain_reason`). Each event's id derives from the node and the moment
its state last changed, so a poll that sees the same disagreement again adds nothing (ingest is
idempotent by id). A poll that fails reaches none of this: the last state stands, never read
as "no drains", and the shell counts the failure (`sentinel_coordinator_scheduler_up`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from sentinel.coordinator.core.effects import SchedulerNode
from sentinel.coordinator.core.rows import NodeRow
from sentinel.coordinator.core.states import NodeState
from sentinel.protocol import (
    Event,
    SchedulerDrainEvent,
    SchedulerDrainPayload,
    SchedulerResumeEvent,
    SchedulerResumePayload,
    Source,
)

MAX_NODES = 1_000_000  # every node Sentinel knows, in one read a poll
OURS = "sentinel"
# Sentinel's own drain reason (`drain_reason`): the Slurm prolog gate's own drains say
# "sentinel: ..." and are someone else's to the coordinator, as an administrator's are.
_OUR_REASON = re.compile(rf"^{OURS}:(\d+|-) ")
IN_SERVICE = frozenset({NodeState.ACTIVE, NodeState.SPARE, NodeState.RETURNED})


def drain_reason(incident_id: int | None, why: str) -> str:
    """The reason Sentinel gives the scheduler for a drain: its incident first, so that
    `sinfo -R` (and this bridge) tells Sentinel's drains from everyone else's."""
    why = why.removeprefix("sentinel:").strip() or "taken out"
    return f"{OURS}:{incident_id if incident_id is not None else '-'} {why}"


def incident_of(reason: str) -> int | None:
    """The incident a drain reason of Sentinel's names; None for anyone else's."""
    found = _OUR_REASON.match(reason)
    return int(found.group(1)) if found and found.group(1) != "-" else None


def disagreements(
    scheduler: Mapping[str, SchedulerNode],
    nodes: Iterable[NodeRow],
    now: float,
    settle_s: float = 0.0,
) -> list[Event]:
    """The events one poll of the scheduler makes, against the nodes Sentinel knows. A node
    whose state moved less than `settle_s` ago is left to the next poll: Sentinel's own move
    may not have reached the scheduler yet (a node kept out after a failed validation is
    `evicted` here a moment before its drain lands there)."""
    out: list[Event] = []
    for node in nodes:
        seen = scheduler.get(node.name)
        if seen is None or now - (node.state_changed_at or 0.0) < settle_s:
            continue
        since = round((node.state_changed_at or 0.0) * 1000)
        source = Source(node=node.name)
        if seen.out and node.state in IN_SERVICE and not _OUR_REASON.match(seen.reason):
            payload = SchedulerDrainPayload(state=seen.state[:64], reason=seen.reason[:500])
            out.append(
                SchedulerDrainEvent(
                    id=f"scheduler-drain-{node.name}-{since}",
                    source=source,
                    ts=now,
                    payload=payload,
                )
            )
        elif not seen.out and node.state == NodeState.EVICTED:
            payload2 = SchedulerResumePayload(state=seen.state[:64])
            out.append(
                SchedulerResumeEvent(
                    id=f"scheduler-resume-{node.name}-{since}",
                    source=source,
                    ts=now,
                    payload=payload2,
                )
            )
    return out
