"""What operators and command targets do through the API: deliver and acknowledge commands,
acknowledge, approve and resolve incidents, queue an action by hand, switch a playbook between
shadow and acting. Plain functions run in the
store thread; every move goes through `lifecycle`, which checks it and audits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core import lifecycle
from sentinel.coordinator.core.actions import ACTIONS
from sentinel.coordinator.core.playbooks import Playbook, PlaybookMode
from sentinel.coordinator.core.rows import CommandRow, ManualStep, RunContext
from sentinel.coordinator.core.states import OPEN_RUNS, Entity, IncidentState, RunState, check
from sentinel.coordinator.core.store import StateStore
from sentinel.protocol import format_validation_error

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


def acknowledge(store: StateStore, incident_id: int, who: str, now: float) -> dict[str, Any]:
    with store.tx():
        if not store.acknowledge_incident(incident_id, who, now):
            raise LookupError(f"no incident {incident_id}")
        store.audit(now, who, "incident.acknowledge", "operator", incident_id)
    return {"incident": incident_id, "acknowledged_by": who}


def approve(store: StateStore, incident_id: int, who: str, now: float) -> dict[str, Any]:
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


def resolve(store: StateStore, incident_id: int, who: str, now: float) -> dict[str, Any]:
    with store.tx():
        # Resolving twice is refused, not a silent no-op: the operator learns it was done.
        check(Entity.INCIDENT, _incident_or_404(store, incident_id), IncidentState.RESOLVED)
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
    store: StateStore,
    dry_run: bool,
    incident_id: int,
    action: str,
    params: dict[str, Any],
    why: str,
    who: str,
    now: float,
) -> dict[str, Any]:
    """Queue a one-step run of ACTION on the incident; the engine runs it like any step
    (a dry run when the coordinator runs dry)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; known: {', '.join(sorted(ACTIONS))}")
    try:
        ACTIONS[action].Params.model_validate(params)
    except ValidationError as e:
        raise ValueError(f"params for {action}: {format_validation_error(e)}") from None
    with store.tx():
        if _incident_or_404(store, incident_id) == IncidentState.RESOLVED:
            raise ValueError(f"incident {incident_id} is resolved")
        context = RunContext(manual=[ManualStep(action=action, params=params)], who=who)
        run_id = lifecycle.create_run(
            store, incident_id, "manual", RunState.PENDING, dry_run, now, context
        )
        store.audit(now, who, f"manual.{action}", why, incident_id, {"params": params})
    return {"incident": incident_id, "run": run_id, "queued_at": now}


# --- playbook modes --------------------------------------------------------------------------


def playbook_modes(
    store: StateStore, books: Sequence[Playbook], cfg: CoordinatorConfig
) -> list[dict[str, Any]]:
    """Every playbook's mode for the runs it opens now, and what set it."""
    switched = store.playbook_modes()
    out = []
    for book in books:
        mode, why = book.mode(switched.get(book.name), cfg)
        out.append({"playbook": book.name, "mode": mode.value, "set_by": why})
    return out


def set_playbook_mode(
    store: StateStore,
    books: Sequence[Playbook],
    cfg: CoordinatorConfig,
    name: str,
    mode: PlaybookMode,
    who: str,
    now: float,
) -> dict[str, Any]:
    """Switch playbook `name` to shadow or acting for the runs it opens from now on (a run
    already under way keeps its mode); audited with the mode it had."""
    book = next((b for b in books if b.name == name), None)
    if book is None:
        known = ", ".join(sorted(b.name for b in books))
        raise LookupError(f"no playbook {name!r}; the coordinator runs: {known}")
    with store.tx():
        was = book.mode(store.playbook_mode(name), cfg)[0].value
        store.set_playbook_mode(name, mode.value, who, now)
        detail = {"playbook": name, "mode": mode.value, "was": was}
        store.audit(now, who, "playbook.mode", f"{name}: {was} -> {mode.value}", None, detail)
    return detail
