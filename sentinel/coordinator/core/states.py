"""Every state the coordinator keeps and every move between them, in one table per entity.

Five kinds of entity have a lifecycle (and the outside effects of repairs a sixth):

- an incident: one fault, however many events report it;
- a playbook run: one attempt at repairing an incident;
- a step: one action of a run (the `actions` table);
- a node: in service, a hot spare, being drained, out of service, being validated, returned;
- a job: what its supervisor last reported, or `lost` when the supervisor went quiet;
- an effect: an outside call (drain, notify) recorded before it is made (`effects.py`).

`lifecycle.py` is the only code that moves an entity, through these tables. The tables in
docs/repair-core.md are generated from `TABLES` (`markdown_tables`), so they cannot drift from
the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from sentinel.protocol import JobState


class Entity(StrEnum):
    INCIDENT = "incident"
    RUN = "run"
    STEP = "step"
    NODE = "node"
    JOB = "job"
    EFFECT = "effect"


class IncidentState(StrEnum):
    OPEN = "open"
    ACTING = "acting"
    MITIGATED = "mitigated"
    RESOLVED = "resolved"
    FAILED = "failed"
    ESCALATED = "escalated"


class RunState(StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    ESCALATED = "escalated"
    CANCELLED = "cancelled"


class StepState(StrEnum):
    STARTED = "started"  # committed before the action first runs; a waiting step stays here
    DONE = "done"
    FAILED = "failed"
    ESCALATED = "escalated"


class NodeState(StrEnum):
    ACTIVE = "active"  # in service (in a job's gang, or free)
    SPARE = "spare"  # a job's idle hot spare
    DRAINING = "draining"  # eviction recorded; the scheduler has not confirmed it yet
    EVICTED = "evicted"  # out of service where the scheduler looks
    VALIDATING = "validating"  # an operator returns it (checked): the scheduler is being told
    RETURNED = "returned"  # passed validation; a job may take it as a spare again


class EffectState(StrEnum):
    INTENDED = "intended"  # recorded; not known to have happened (after a crash: ask)
    DONE = "done"
    FAILED = "failed"


Inc, R, St, N, J, E = IncidentState, RunState, StepState, NodeState, JobState, EffectState

INCIDENT: dict[IncidentState, frozenset[IncidentState]] = {
    Inc.OPEN: frozenset({Inc.ACTING, Inc.ESCALATED, Inc.RESOLVED, Inc.FAILED}),
    Inc.ACTING: frozenset({Inc.MITIGATED, Inc.FAILED, Inc.ESCALATED, Inc.RESOLVED}),
    Inc.MITIGATED: frozenset(
        {Inc.RESOLVED, Inc.ESCALATED, Inc.OPEN}
    ),  # OPEN: recurred after cooldown
    Inc.ESCALATED: frozenset({Inc.ACTING, Inc.RESOLVED, Inc.FAILED}),
    Inc.FAILED: frozenset({Inc.ESCALATED, Inc.RESOLVED}),
    Inc.RESOLVED: frozenset(),
}
RUN: dict[RunState, frozenset[RunState]] = {
    R.AWAITING_APPROVAL: frozenset({R.PENDING, R.CANCELLED}),
    R.PENDING: frozenset({R.RUNNING, R.CANCELLED}),
    R.RUNNING: frozenset({R.WAITING, R.DONE, R.FAILED, R.ESCALATED, R.CANCELLED}),
    R.WAITING: frozenset({R.RUNNING, R.DONE, R.FAILED, R.ESCALATED, R.CANCELLED}),
    R.DONE: frozenset(),
    R.FAILED: frozenset(),
    R.ESCALATED: frozenset({R.PENDING, R.CANCELLED}),  # an operator may retry after fixing
    R.CANCELLED: frozenset(),
}
STEP: dict[StepState, frozenset[StepState]] = {
    St.STARTED: frozenset({St.DONE, St.FAILED, St.ESCALATED}),
    St.DONE: frozenset(),
    St.FAILED: frozenset(),
    St.ESCALATED: frozenset({St.STARTED, St.DONE, St.FAILED}),  # its run was approved again
}
NODE: dict[NodeState, frozenset[NodeState]] = {
    N.ACTIVE: frozenset({N.SPARE, N.DRAINING}),
    N.SPARE: frozenset({N.ACTIVE, N.DRAINING}),  # ACTIVE: swapped into a gang
    N.DRAINING: frozenset({N.EVICTED, N.ACTIVE}),  # ACTIVE: the scheduler refused the drain
    N.EVICTED: frozenset({N.VALIDATING}),
    N.VALIDATING: frozenset({N.RETURNED, N.EVICTED}),
    N.RETURNED: frozenset({N.SPARE, N.ACTIVE, N.DRAINING}),
}
# The supervisor is the authority on its job: every reported state is taken, from any state
# but a finished job's. `lost` is the coordinator's, when heartbeats stop.
_REPORTED = frozenset(s for s in J if s is not J.LOST)
JOB: dict[JobState, frozenset[JobState]] = {
    **{s: _REPORTED - {s} | {J.LOST} for s in J if s in _REPORTED},
    J.FINISHED: frozenset({J.STARTING}),  # the same job id launched again
    J.FAILED: frozenset({J.STARTING, J.RUNNING}),
    J.LOST: _REPORTED,  # the supervisor came back
}
EFFECT: dict[EffectState, frozenset[EffectState]] = {
    E.INTENDED: frozenset({E.DONE, E.FAILED}),
    E.DONE: frozenset(),
    E.FAILED: frozenset(),
}

TABLES: Mapping[Entity, Mapping[Any, frozenset[Any]]] = {
    Entity.INCIDENT: INCIDENT,
    Entity.RUN: RUN,
    Entity.STEP: STEP,
    Entity.NODE: NODE,
    Entity.JOB: JOB,
    Entity.EFFECT: EFFECT,
}
# The states an entity's first row may hold.
INITIAL: Mapping[Entity, frozenset[Any]] = {
    Entity.INCIDENT: frozenset({Inc.OPEN}),
    Entity.RUN: frozenset({R.AWAITING_APPROVAL, R.PENDING}),
    Entity.STEP: frozenset({St.STARTED}),
    Entity.NODE: frozenset({N.ACTIVE, N.SPARE}),
    Entity.JOB: _REPORTED,
    Entity.EFFECT: frozenset({E.INTENDED}),
}
STATE_TYPES: Mapping[Entity, type[StrEnum]] = {
    Entity.INCIDENT: IncidentState,
    Entity.RUN: RunState,
    Entity.STEP: StepState,
    Entity.NODE: NodeState,
    Entity.JOB: JobState,
    Entity.EFFECT: EffectState,
}

# States in which a new report of the same fault joins the incident instead of opening one.
ACTIVE_INCIDENT = frozenset({Inc.OPEN, Inc.ACTING, Inc.MITIGATED, Inc.ESCALATED})
LIVE_RUNS = (R.PENDING, R.RUNNING, R.WAITING)
OPEN_RUNS = frozenset({R.AWAITING_APPROVAL, R.PENDING, R.RUNNING, R.WAITING, R.ESCALATED})
ENDED_JOBS = frozenset({J.FINISHED, J.FAILED, J.LOST})
OUT_OF_SERVICE = frozenset({N.DRAINING, N.EVICTED})  # what the eviction budget counts
RECOVERED = frozenset({Inc.MITIGATED, Inc.RESOLVED})


class TransitionError(ValueError):
    pass


def check(entity: Entity, current: StrEnum, new: StrEnum) -> None:
    allowed = TABLES[entity][current]
    if new not in allowed:
        options = ", ".join(sorted(allowed)) or "none (terminal)"
        raise TransitionError(f"{entity} cannot move {current} -> {new}; allowed: {options}")


def markdown_tables() -> str:
    """One table per entity: each state and where it may go. docs/repair-core.md embeds it."""
    out = []
    for entity, table in TABLES.items():
        start = ", ".join(sorted(INITIAL[entity]))
        out.append(f"| **{entity}** (starts: {start}) | may move to |\n|---|---|")
        for state, targets in table.items():
            out.append(f"| {state} | {', '.join(sorted(targets)) or '(terminal)'} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if (
    __name__ == "__main__"
):  # docs/repair-core.md's tables: python -m sentinel.coordinator.core.states
    print(markdown_tables(), end="")
