"""What operators and `/metrics` read: lists, an incident's whole record, counts over every
incident and run; and the flight-recorder dumps nodes upload."""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlalchemy import delete, func, select

from sentinel.coordinator.core.rows import (
    AuditRow,
    EventRow,
    IncidentRow,
    IncidentView,
    NodeRow,
    RepairStagesRow,
    RunRow,
    StepRow,
)
from sentinel.coordinator.core.states import Entity
from sentinel.coordinator.store.base import columns
from sentinel.coordinator.store.incidents import INCIDENT, RUN, STAGES, STEP, IncidentsRepo
from sentinel.coordinator.store.schema import (
    STATE_COLUMNS,
    actions,
    audit,
    events,
    fr_dumps,
    incidents,
    nodes,
    repair_stages,
    runs,
)

_AUDIT = [audit.c[n] for n in columns(AuditRow)]


class ReportsRepo(IncidentsRepo):
    def state_counts(self, entity: Entity) -> dict[str, int]:
        state = STATE_COLUMNS[entity].state
        return {str(s): int(n) for s, n in self._x(select(state, func.count()).group_by(state))}

    def nodes(self, limit: int) -> list[NodeRow]:
        listed = select(*[nodes.c[n] for n in columns(NodeRow)]).order_by(nodes.c.name)
        return self._rows(NodeRow, listed.limit(limit))

    def fingerprints(self) -> dict[str, dict[str, str]]:
        """Each node's latest configuration fingerprint (`agent.fingerprint` events; an agent
        sends its own again before retention would prune it)."""
        kind = events.c.kind == "agent.fingerprint"
        latest = select(func.max(events.c.seq)).where(kind).group_by(events.c.node)
        read = select(events.c.node, events.c.payload).where(events.c.seq.in_(latest))
        return {str(node): json.loads(payload)["fields"] for node, payload in self._x(read)}

    def incidents(self, limit: int, state: str | None = None) -> list[IncidentRow]:
        listed = select(*INCIDENT).order_by(incidents.c.id).limit(limit)
        if state is not None:
            listed = listed.where(incidents.c.state == str(state))
        return self._rows(IncidentRow, listed)

    def incident_view(self, incident_id: int, events_limit: int) -> IncidentView | None:
        incident = self.incident(incident_id)
        if incident is None:
            return None
        held = select(*[events.c[n] for n in columns(EventRow)])
        held = held.where(events.c.incident_id == incident_id).order_by(events.c.ts)
        return IncidentView(
            incident,
            self._rows(EventRow, held.limit(events_limit)),
            self._rows(
                RunRow, select(*RUN).where(runs.c.incident_id == incident_id).order_by(runs.c.id)
            ),
            self.incident_steps(incident_id),
            self._rows(
                AuditRow,
                select(*_AUDIT).where(audit.c.incident_id == incident_id).order_by(audit.c.id),
            ),
            self.repair_stages(incident_id),
        )

    def fault_counts(self) -> dict[str, int]:
        fault = incidents.c.fault
        counted = select(fault, func.count()).group_by(fault).order_by(fault)
        return {str(f): int(n) for f, n in self._x(counted)}

    def run_counts(self) -> list[tuple[str, bool, str, int]]:
        """(playbook, dry run, status, runs) over every run the store holds."""
        by = (runs.c.playbook, runs.c.dry_run, runs.c.status)
        rows = self._x(select(*by, func.count()).group_by(*by).order_by(*by))
        return [(str(p), bool(d), str(s), int(n)) for p, d, s, n in rows]

    def shadow_action_counts(self) -> list[tuple[str, str, int]]:
        """(playbook, action, steps) of the dry-run steps: what shadow runs would have done."""
        by = (runs.c.playbook, actions.c.action)
        counted = select(*by, func.count()).join_from(actions, runs, runs.c.id == actions.c.run_id)
        rows = self._x(counted.where(actions.c.dry_run == 1).group_by(*by).order_by(*by))
        return [(str(p), str(a), int(n)) for p, a, n in rows]

    def detect_seconds(self) -> list[float]:
        first = incidents.c.opened_at - func.min(events.c.ts)
        found = select(first).join_from(incidents, events, events.c.incident_id == incidents.c.id)
        return [float(r[0]) for r in self._x(found.group_by(incidents.c.id))]

    def stage_seconds(self) -> list[tuple[str, str, float]]:
        """(playbook, stage, seconds) of every live run's repair stages: `decide` (the run
        created to its first step started), then each finished step by its action."""
        joined = (runs, actions, actions.c.run_id == runs.c.id)
        decide = select(runs.c.playbook, func.min(actions.c.started_at) - runs.c.created_at)
        decide = decide.join_from(*joined).where(runs.c.dry_run == 0)
        decide = decide.group_by(runs.c.id, runs.c.playbook, runs.c.created_at)
        took = actions.c.done_at - actions.c.started_at
        steps = select(runs.c.playbook, actions.c.action, took).join_from(*joined)
        steps = steps.where(actions.c.dry_run == 0, actions.c.state == "done")
        steps = steps.where(actions.c.done_at.is_not(None))
        return [(str(p), "decide", float(s)) for p, s in self._x(decide)] + [
            (str(p), str(a), float(s)) for p, a, s in self._x(steps)
        ]

    def repair_stages(self, incident_id: int | None = None) -> list[RepairStagesRow]:
        """One incident's repairs' stages, or every repair's (`/metrics`)."""
        found = select(*STAGES).order_by(repair_stages.c.run_id)
        if incident_id is not None:
            found = found.where(repair_stages.c.incident_id == incident_id)
        return self._rows(RepairStagesRow, found)

    def recover_seconds(self, states: Iterable[str]) -> list[float]:
        took = select(incidents.c.updated_at - incidents.c.opened_at)
        return [
            float(r[0])
            for r in self._x(took.where(incidents.c.state.in_([str(s) for s in states])))
        ]

    def steps(self, limit: int) -> list[StepRow]:
        return self._rows(StepRow, select(*STEP).order_by(actions.c.id).limit(limit))

    def audit_log(self, limit: int) -> list[AuditRow]:
        return self._rows(AuditRow, select(*_AUDIT).order_by(audit.c.id.desc()).limit(limit))

    # --- flight-recorder dumps --------------------------------------------------------------

    def put_fr_dump(self, check_id: str, node: str, name: str, data: bytes, now: float) -> None:
        """Store one dump file of a check (an upload again replaces it)."""
        upload = self._insert(fr_dumps).values(
            check_id=check_id, node=node, name=name, data=data, stored_at=now
        )
        again = {"data": upload.excluded.data, "stored_at": upload.excluded.stored_at}
        self._x(
            upload.on_conflict_do_update(index_elements=["check_id", "node", "name"], set_=again)
        )

    def fr_dumps(self, check_id: str) -> list[tuple[str, str, bytes]]:
        """(node, file name, bytes) of every dump file of a check, by node and name."""
        found = select(fr_dumps.c.node, fr_dumps.c.name, fr_dumps.c.data)
        found = found.where(fr_dumps.c.check_id == check_id).order_by(
            fr_dumps.c.node, fr_dumps.c.name
        )
        return [(str(n), str(f), bytes(d)) for n, f, d in self._x(found)]

    def fr_dump_names(self, check_id: str) -> list[tuple[str, str]]:
        """(node, file name) of every dump file of a check, by node and name: no bytes."""
        found = select(fr_dumps.c.node, fr_dumps.c.name).where(fr_dumps.c.check_id == check_id)
        found = found.order_by(fr_dumps.c.node, fr_dumps.c.name)
        return [(str(n), str(f)) for n, f in self._x(found)]

    def prune_fr_dumps(self, cutoff: float) -> int:
        """Delete dumps stored before `cutoff` (the events' retention)."""
        return max(int(self._x(delete(fr_dumps).where(fr_dumps.c.stored_at < cutoff))), 0)
