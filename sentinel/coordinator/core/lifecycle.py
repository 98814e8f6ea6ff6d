"""The one function that moves an entity from state to state, and the ones that create them.

`move` is the only code that changes a state column: it checks the entity's table
(`states.py`), writes the row and the audit entry in the caller's transaction. The `create`
functions write an entity's first row, in one of its initial states. A test
(tests/test_coordinator_lifecycle.py) reads the source and fails if any other module calls a
state writer.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sentinel.coordinator.core.states import (
    INITIAL,
    STATE_TYPES,
    EffectState,
    Entity,
    IncidentState,
    NodeState,
    RunState,
    StepState,
    TransitionError,
    check,
)
from sentinel.protocol import JobStatusPayload

if TYPE_CHECKING:
    from sentinel.coordinator.core.rows import EffectRow, IncidentDetail, RunContext
    from sentinel.coordinator.core.store import StateStore

log = logging.getLogger(__name__)
Inc, R, St, E = IncidentState, RunState, StepState, EffectState


def move(
    store: StateStore,
    entity: Entity,
    key: str | int,
    new: StrEnum,
    now: float,
    who: str,
    why: str,
    *,
    incident_id: int | None = None,
    what: str | None = None,
    reason: str | None = None,
    detail: dict[str, Any] | None = None,
) -> bool:
    """Move one entity to `new`: check the table, write the state (only if it is still the
    state read: another writer that moved it first wins) and the audit entry. False when the
    entity already is in `new`; `TransitionError` when the table forbids the move,
    `LookupError` when there is no such entity."""
    raw = store.state_of(entity, key)
    if raw is None:
        raise LookupError(f"no {entity} {key!r}")
    current = STATE_TYPES[entity](raw)
    if current == new:
        return False
    check(entity, current, new)
    if not store.set_state(entity, key, new, now, expected=current, reason=reason):
        raise TransitionError(f"{entity} {key!r} moved from {current} while being moved")
    store.audit(
        now,
        who,
        what or f"{entity}.{new}",
        why,
        incident_id,
        {entity.value: key, "from": current.value, "to": new.value, **(detail or {})},
    )
    if entity is Entity.INCIDENT:  # an operator tailing the journal sees each incident move
        log.info("incident %s: %s -> %s", key, current, new, extra={"incident": key})
    return True


def initial(entity: Entity, state: StrEnum) -> StrEnum:
    """`state`, checked to be one an entity of this kind may start in (for a `create`)."""
    if state not in INITIAL[entity]:
        raise TransitionError(f"a {entity} cannot start {state}")
    return state


# --- creation: an entity's first row, in one of its initial states ------------------------


def add_node(
    store: StateStore, name: str, state: NodeState, now: float, reason: str | None = None
) -> bool:
    """A node first known from a job's report (a node only heard from starts active through
    `touch_nodes`); False when it was known already."""
    return store.insert_node(name, initial(Entity.NODE, state), now, reason)


def report_job(store: StateStore, job_id: str, status: JobStatusPayload, now: float) -> None:
    """A supervisor's heartbeat: the job's status, and its state moved to the reported one."""
    if store.state_of(Entity.JOB, job_id) is None:
        store.insert_job(job_id, initial(Entity.JOB, status.state), status, now)
        return
    store.save_job_status(job_id, status, now)
    move(store, Entity.JOB, job_id, status.state, now, f"job:{job_id}", "supervisor report")


def open_incident(
    store: StateStore,
    *,
    key: str,
    fault: str,
    target: str,
    job: str | None,
    run: tuple[str, RunState, bool],
    now: float,
    first_step: int | None,
    detail: IncidentDetail,
    why: str,
    audit_detail: dict[str, Any],
) -> int:
    """Open an incident and its first run of `run` = (playbook, state, dry run)."""
    playbook, state, dry_run = run
    incident_id = store.insert_incident(
        key, fault, target, job, Inc.OPEN, playbook, now, first_step, detail
    )
    store.audit(now, "coordinator", "incident.open", why, incident_id, audit_detail)
    store.insert_run(incident_id, playbook, initial(Entity.RUN, state), dry_run, now)
    return incident_id


def create_run(
    store: StateStore,
    incident_id: int,
    playbook: str,
    state: RunState,
    dry_run: bool,
    now: float,
    context: RunContext | None = None,
) -> int:
    return store.insert_run(
        incident_id, playbook, initial(Entity.RUN, state), dry_run, now, context
    )


def start_step(
    store: StateStore,
    key: str,
    incident_id: int,
    run_id: int,
    action: str,
    params: dict[str, Any],
    dry_run: bool,
    who: str,
    now: float,
) -> None:
    store.insert_step(key, incident_id, run_id, action, params, St.STARTED, dry_run, who, now)


def intend_effect(
    store: StateStore,
    key: str,
    kind: str,
    target: str,
    args: dict[str, Any],
    incident_id: int | None,
    now: float,
) -> EffectRow:
    """Record an outside effect before it is made (idempotent by `key`)."""
    return store.insert_effect(key, kind, target, args, E.INTENDED, incident_id, now)
