"""Store reads and operator writes behind the API; plain functions run in the store thread.

Reads hand back JSON-ready documents made from the store's typed rows; operator writes move
entities through `lifecycle`, which checks each move and audits it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic_core import to_jsonable_python

from sentinel.coordinator import lifecycle
from sentinel.coordinator.actions import ACTIONS
from sentinel.coordinator.lifecycle import OPEN_RUNS, Entity, IncidentState, RunState
from sentinel.coordinator.store import StateStore
from sentinel.coordinator.store.rows import CommandRow, ManualStep, RunContext

if TYPE_CHECKING:
    from sentinel.coordinator.service import Service

INCIDENT_EVENTS = 1000  # events an incident's page lists at most


def as_json(value: Any) -> Any:
    """Rows (dataclasses, models, enums) as the plain JSON values the API answers with."""
    return to_jsonable_python(value)


def _limit(q: dict[str, str], default: int = 500) -> int:
    try:
        return max(1, min(int(q.get("limit", default)), 10_000))
    except ValueError:
        raise ValueError(f"limit must be an integer, got {q.get('limit')!r}") from None


def nodes(store: StateStore, q: dict[str, str]) -> list[dict[str, Any]]:
    return as_json(store.nodes(_limit(q, 100_000)))  # type: ignore[no-any-return]


def jobs(store: StateStore, q: dict[str, str]) -> list[dict[str, Any]]:
    return as_json(store.jobs(_limit(q)))  # type: ignore[no-any-return]


def incidents(store: StateStore, q: dict[str, str]) -> list[dict[str, Any]]:
    state = q.get("state")
    if state is not None and state not in set(IncidentState):
        raise ValueError(f"unknown incident state {state!r}; one of {', '.join(IncidentState)}")
    return as_json(store.incidents(_limit(q), state))  # type: ignore[no-any-return]


def incident(store: StateStore, incident_id: int) -> dict[str, Any] | None:
    view = store.incident_view(incident_id, INCIDENT_EVENTS)
    if view is None:
        return None
    doc: dict[str, Any] = as_json(view.incident)
    doc.update(
        events=as_json(view.events),
        runs=as_json(view.runs),
        actions=as_json(view.actions),
        audit=as_json(view.audit),
        stages=as_json(view.stages),  # each relaunching repair's timeline (`stages.py`)
    )
    return doc


def actions(store: StateStore, q: dict[str, str]) -> list[dict[str, Any]]:
    return as_json(store.steps(_limit(q)))  # type: ignore[no-any-return]


def audit(store: StateStore, q: dict[str, str]) -> list[dict[str, Any]]:
    return as_json(store.audit_log(_limit(q)))  # type: ignore[no-any-return]


# --- commands --------------------------------------------------------------------------------


def take_commands(store: StateStore, kind: str, target: str, now: float) -> list[dict[str, Any]]:
    """Unacknowledged commands for a target (at-least-once: redelivered until acked)."""
    return [
        {
            "v": 1,
            "id": r.id,
            "kind": r.kind,
            "target": {kind: target},
            "ts": r.created_at,
            "args": r.args,
        }
        for r in store.take_commands(kind, target, now)
    ]


def command(store: StateStore, cid: str) -> CommandRow | None:
    return store.command(cid)


def ack_command(
    store: StateStore, cid: str, ok: bool, detail: dict[str, Any], who: str, now: float
) -> None:
    with store.tx():
        if store.ack_command(cid, {"ok": ok, **detail}, now):
            row = store.command(cid)
            assert row is not None
            store.audit(
                now,
                who,
                "command.ack",
                "ok" if ok else "failed",
                row.incident_id,
                {"command": cid, "kind": row.kind, **detail},
            )


# --- operator actions ------------------------------------------------------------------------


def _incident_or_404(store: StateStore, incident_id: int) -> IncidentState:
    row = store.incident(incident_id)
    if row is None:
        raise LookupError(f"no incident {incident_id}")
    return row.state


def acknowledge(service: Service, incident_id: int, who: str, now: float) -> dict[str, Any]:
    store = service.store
    with store.tx():
        if not store.acknowledge_incident(incident_id, who, now):
            raise LookupError(f"no incident {incident_id}")
        store.audit(now, who, "incident.acknowledge", "operator", incident_id)
    return {"incident": incident_id, "acknowledged_by": who}


def approve(service: Service, incident_id: int, who: str, now: float) -> dict[str, Any]:
    store = service.store
    with store.tx():
        _incident_or_404(store, incident_id)
        runs = store.runs([RunState.AWAITING_APPROVAL, RunState.ESCALATED], incident_id)
        if not runs:
            raise ValueError(f"incident {incident_id} has no run awaiting approval")
        for run in runs:
            lifecycle.move(
                store,
                Entity.RUN,
                run.id,
                RunState.PENDING,
                now,
                who,
                "operator approved",
                incident_id=incident_id,
                what="run.approve",
            )
    return {"incident": incident_id, "approved_runs": [r.id for r in runs]}


def resolve(service: Service, incident_id: int, who: str, now: float) -> dict[str, Any]:
    store = service.store
    with store.tx():
        # Resolving twice is refused, not a silent no-op: the operator learns it was done.
        lifecycle.check(
            Entity.INCIDENT, _incident_or_404(store, incident_id), IncidentState.RESOLVED
        )
        lifecycle.move(
            store,
            Entity.INCIDENT,
            incident_id,
            IncidentState.RESOLVED,
            now,
            who,
            "operator resolved",
            incident_id=incident_id,
            what="incident.resolve",
        )
        for run in store.runs(OPEN_RUNS, incident_id):
            lifecycle.move(
                store,
                Entity.RUN,
                run.id,
                RunState.CANCELLED,
                now,
                who,
                "its incident was resolved",
                incident_id=incident_id,
            )
    return {"incident": incident_id, "state": "resolved"}


def run_action(
    service: Service,
    incident_id: int,
    action: str,
    params: dict[str, Any],
    why: str,
    who: str,
    now: float,
) -> dict[str, Any]:
    """Queue a one-step run of ACTION on the incident; the engine runs it like any step."""
    store = service.store
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; known: {', '.join(sorted(ACTIONS))}")
    try:
        ACTIONS[action].Params.model_validate(params)
    except Exception as e:
        raise ValueError(f"params for {action}: {e}") from None
    with store.tx():
        if _incident_or_404(store, incident_id) == IncidentState.RESOLVED:
            raise ValueError(f"incident {incident_id} is resolved")
        context = RunContext(manual=[ManualStep(action=action, params=params)], who=who)
        run_id = lifecycle.create_run(
            store, incident_id, "manual", RunState.PENDING, service.cfg.dry_run, now, context
        )
        store.audit(now, who, f"manual.{action}", why, incident_id, {"params": params})
    service.kick()
    return {"incident": incident_id, "run": run_id, "queued_at": time.time()}
