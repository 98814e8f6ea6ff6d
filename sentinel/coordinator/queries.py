"""Store reads and operator writes behind the API; plain functions run in the store thread."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sentinel.coordinator.actions import ACTIONS
from sentinel.coordinator.engine import RunState, check_run_transition
from sentinel.coordinator.incidents import IncidentState, check_transition
from sentinel.coordinator.store import Store, dumps

if TYPE_CHECKING:
    from sentinel.coordinator.service import Service


def _limit(q: dict[str, str], default: int = 500) -> int:
    try:
        return max(1, min(int(q.get("limit", default)), 10_000))
    except ValueError:
        raise ValueError(f"limit must be an integer, got {q.get('limit')!r}") from None


def nodes(store: Store, q: dict[str, str]) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM nodes ORDER BY name LIMIT ?", (_limit(q, 100_000),))


def jobs(store: Store, q: dict[str, str]) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM jobs ORDER BY id LIMIT ?", (_limit(q),))


def incidents(store: Store, q: dict[str, str]) -> list[dict[str, Any]]:
    if "state" in q:
        IncidentState(q["state"]) if q["state"] in set(IncidentState) else _bad_state(q["state"])
        return store.query(
            "SELECT * FROM incidents WHERE state=? ORDER BY id LIMIT ?", (q["state"], _limit(q))
        )
    return store.query("SELECT * FROM incidents ORDER BY id LIMIT ?", (_limit(q),))


def _bad_state(state: str) -> None:
    raise ValueError(f"unknown incident state {state!r}; one of {', '.join(IncidentState)}")


def incident(store: Store, incident_id: int) -> dict[str, Any] | None:
    doc = store.one("SELECT * FROM incidents WHERE id=?", (incident_id,))
    if doc is None:
        return None
    doc["events"] = store.query(
        "SELECT id, kind, node, rank, job, ts FROM events WHERE incident_id=?"
        " ORDER BY ts LIMIT 1000",
        (incident_id,),
    )
    doc["runs"] = store.query("SELECT * FROM runs WHERE incident_id=? ORDER BY id", (incident_id,))
    doc["actions"] = store.query(
        "SELECT * FROM actions WHERE incident_id=? ORDER BY id", (incident_id,)
    )
    doc["audit"] = store.query(
        "SELECT * FROM audit WHERE incident_id=? ORDER BY id", (incident_id,)
    )
    return doc


def actions(store: Store, q: dict[str, str]) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM actions ORDER BY id LIMIT ?", (_limit(q),))


def audit(store: Store, q: dict[str, str]) -> list[dict[str, Any]]:
    return store.query("SELECT * FROM audit ORDER BY id DESC LIMIT ?", (_limit(q),))


# --- commands --------------------------------------------------------------------------------


def take_commands(store: Store, kind: str, target: str, now: float) -> list[dict[str, Any]]:
    """Unacknowledged commands for a target (at-least-once: redelivered until acked)."""
    rows = store.query(
        "SELECT * FROM commands WHERE target_kind=? AND target=? AND acked_at IS NULL"
        " ORDER BY created_at, id",
        (kind, target),
    )
    if rows:
        with store.tx():
            store.execute(
                "UPDATE commands SET delivered_at=? WHERE target_kind=? AND target=?"
                " AND delivered_at IS NULL",
                (now, kind, target),
            )
    return [
        {
            "v": 1,
            "id": r["id"],
            "kind": r["kind"],
            "target": {kind: target},
            "ts": r["created_at"],
            "args": r["args"],
        }
        for r in rows
    ]


def ack_command(
    store: Store, cid: str, ok: bool, detail: dict[str, Any], who: str, now: float
) -> None:
    with store.tx():
        cur = store.execute(
            "UPDATE commands SET acked_at=?, result=? WHERE id=? AND acked_at IS NULL",
            (now, dumps({"ok": ok, **detail}), cid),
        )
        if cur.rowcount:
            row = store.one("SELECT kind, incident_id FROM commands WHERE id=?", (cid,))
            assert row is not None
            store.audit(
                now,
                who,
                "command.ack",
                "ok" if ok else "failed",
                row["incident_id"],
                {"command": cid, "kind": row["kind"], **detail},
            )


# --- operator actions ------------------------------------------------------------------------


def _incident_or_404(store: Store, incident_id: int) -> dict[str, Any]:
    row = store.one("SELECT * FROM incidents WHERE id=?", (incident_id,))
    if row is None:
        raise LookupError(f"no incident {incident_id}")
    return row


def acknowledge(service: Service, incident_id: int, who: str, now: float) -> dict[str, Any]:
    store = service.store
    with store.tx():
        _incident_or_404(store, incident_id)
        store.execute(
            "UPDATE incidents SET acknowledged_by=?, updated_at=? WHERE id=?",
            (who, now, incident_id),
        )
        store.audit(now, who, "incident.acknowledge", "operator", incident_id)
    return {"incident": incident_id, "acknowledged_by": who}


def approve(service: Service, incident_id: int, who: str, now: float) -> dict[str, Any]:
    store = service.store
    with store.tx():
        _incident_or_404(store, incident_id)
        runs = store.query(
            "SELECT id, status FROM runs WHERE incident_id=? AND status IN (?,?)",
            (incident_id, RunState.AWAITING_APPROVAL, RunState.ESCALATED),
        )
        if not runs:
            raise ValueError(f"incident {incident_id} has no run awaiting approval")
        for run in runs:
            check_run_transition(RunState(run["status"]), RunState.PENDING)
            store.execute(
                "UPDATE runs SET status='pending', updated_at=? WHERE id=?", (now, run["id"])
            )
        store.audit(
            now,
            who,
            "run.approve",
            "operator approved",
            incident_id,
            {"runs": [r["id"] for r in runs]},
        )
    return {"incident": incident_id, "approved_runs": [r["id"] for r in runs]}


def resolve(service: Service, incident_id: int, who: str, now: float) -> dict[str, Any]:
    store = service.store
    with store.tx():
        row = _incident_or_404(store, incident_id)
        check_transition(IncidentState(row["state"]), IncidentState.RESOLVED)
        store.execute(
            "UPDATE incidents SET state='resolved', updated_at=? WHERE id=?", (now, incident_id)
        )
        store.execute(
            "UPDATE runs SET status='cancelled', updated_at=? WHERE incident_id=?"
            " AND status IN ('awaiting_approval','pending','running','waiting','escalated')",
            (now, incident_id),
        )
        store.audit(now, who, "incident.resolve", "operator resolved", incident_id)
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
        row = _incident_or_404(store, incident_id)
        if row["state"] == IncidentState.RESOLVED:
            raise ValueError(f"incident {incident_id} is resolved")
        context = {"_steps": [{"action": action, "params": params}], "_who": who}
        cur = store.execute(
            "INSERT INTO runs (incident_id, playbook, status, context, dry_run, created_at,"
            " updated_at) VALUES (?,?,?,?,?,?,?)",
            (incident_id, "manual", "pending", dumps(context), int(service.cfg.dry_run), now, now),
        )
        store.audit(now, who, f"manual.{action}", why, incident_id, {"params": params})
    service.kick()
    return {"incident": incident_id, "run": cur.lastrowid, "queued_at": time.time()}
