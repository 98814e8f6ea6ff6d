"""What operators and `/metrics` read: lists, an incident's whole record, counts over every
incident and run, and the flight-recorder dumps nodes upload."""

from __future__ import annotations

from collections.abc import Iterable

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
from sentinel.coordinator.store.base import (
    AUDIT_COLS,
    INCIDENT_COLS,
    NODE_COLS,
    RUN_COLS,
    STAGE_COLS,
    STATE_COLUMNS,
    STEP_COLS,
    from_row,
)
from sentinel.coordinator.store.incidents import IncidentsRepo


class ReportsRepo(IncidentsRepo):
    def state_counts(self, entity: Entity) -> dict[str, int]:
        table, col, _ = STATE_COLUMNS[entity]
        return {
            str(r[0]): int(r[1])
            for r in self._all(f"SELECT {col}, COUNT(*) FROM {table} GROUP BY {col}")
        }

    def nodes(self, limit: int) -> list[NodeRow]:
        return self._rows(NodeRow, f"SELECT {NODE_COLS} FROM nodes ORDER BY name LIMIT ?", (limit,))

    def incidents(self, limit: int, state: str | None = None) -> list[IncidentRow]:
        if state is None:
            rows = self._all(f"SELECT {INCIDENT_COLS} FROM incidents ORDER BY id LIMIT ?", (limit,))
        else:
            rows = self._all(
                f"SELECT {INCIDENT_COLS} FROM incidents WHERE state=? ORDER BY id LIMIT ?",
                (str(state), limit),
            )
        return [from_row(IncidentRow, r) for r in rows]

    def incident_view(self, incident_id: int, events_limit: int) -> IncidentView | None:
        incident = self.incident(incident_id)
        if incident is None:
            return None
        events = [
            from_row(EventRow, r)
            for r in self._all(
                "SELECT id, kind, node, rank, job, ts FROM events WHERE incident_id=?"
                " ORDER BY ts LIMIT ?",
                (incident_id, events_limit),
            )
        ]
        audit = self._all(
            f"SELECT {AUDIT_COLS} FROM audit WHERE incident_id=? ORDER BY id", (incident_id,)
        )
        runs = self._all(
            f"SELECT {RUN_COLS} FROM runs WHERE incident_id=? ORDER BY id", (incident_id,)
        )
        return IncidentView(
            incident,
            events,
            [from_row(RunRow, r) for r in runs],
            self.incident_steps(incident_id),
            [from_row(AuditRow, r) for r in audit],
            self.repair_stages(incident_id),
        )

    def fault_counts(self) -> dict[str, int]:
        return {
            str(f): int(n)
            for f, n in self._all(
                "SELECT fault, COUNT(*) FROM incidents GROUP BY fault ORDER BY fault"
            )
        }

    def run_counts(self) -> list[tuple[str, bool, str, int]]:
        """(playbook, dry run, status, runs) over every run the store holds."""
        rows = self._all(
            "SELECT playbook, dry_run, status, COUNT(*) FROM runs"
            " GROUP BY playbook, dry_run, status ORDER BY playbook, dry_run, status"
        )
        return [(str(p), bool(d), str(s), int(n)) for p, d, s, n in rows]

    def shadow_action_counts(self) -> list[tuple[str, str, int]]:
        """(playbook, action, steps) of the dry-run steps: what shadow runs would have done."""
        rows = self._all(
            "SELECT r.playbook, a.action, COUNT(*) FROM actions a JOIN runs r ON r.id = a.run_id"
            " WHERE a.dry_run=1 GROUP BY r.playbook, a.action ORDER BY r.playbook, a.action"
        )
        return [(str(p), str(a), int(n)) for p, a, n in rows]

    def detect_seconds(self) -> list[float]:
        return [
            float(r[0])
            for r in self._all(
                "SELECT i.opened_at - MIN(e.ts) FROM incidents i"
                " JOIN events e ON e.incident_id = i.id GROUP BY i.id"
            )
        ]

    def stage_seconds(self) -> list[tuple[str, str, float]]:
        """(playbook, stage, seconds) of every live run's repair stages: `decide` (the run
        created to its first step started), then each finished step by its action."""
        decide = self._all(
            "SELECT r.playbook, MIN(a.started_at) - r.created_at FROM runs r"
            " JOIN actions a ON a.run_id = r.id WHERE r.dry_run=0"
            " GROUP BY r.id, r.playbook, r.created_at"
        )
        steps = self._all(
            "SELECT r.playbook, a.action, a.done_at - a.started_at FROM actions a"
            " JOIN runs r ON r.id = a.run_id"
            " WHERE a.dry_run=0 AND a.state='done' AND a.done_at IS NOT NULL"
        )
        return [(str(p), "decide", float(s)) for p, s in decide] + [
            (str(p), str(a), float(s)) for p, a, s in steps
        ]

    def repair_stages(self, incident_id: int | None = None) -> list[RepairStagesRow]:
        """One incident's repairs' stages, or every repair's (`/metrics`)."""
        if incident_id is None:
            return self._rows(
                RepairStagesRow, f"SELECT {STAGE_COLS} FROM repair_stages ORDER BY run_id"
            )
        return self._rows(
            RepairStagesRow,
            f"SELECT {STAGE_COLS} FROM repair_stages WHERE incident_id=? ORDER BY run_id",
            (incident_id,),
        )

    def recover_seconds(self, states: Iterable[str]) -> list[float]:
        states = [str(s) for s in states]
        return [
            float(r[0])
            for r in self._all(
                "SELECT updated_at - opened_at FROM incidents"
                f" WHERE state IN ({','.join('?' * len(states))})",
                states,
            )
        ]

    def steps(self, limit: int) -> list[StepRow]:
        return self._rows(StepRow, f"SELECT {STEP_COLS} FROM actions ORDER BY id LIMIT ?", (limit,))

    def put_fr_dump(self, check_id: str, node: str, name: str, data: bytes, now: float) -> None:
        """Store one dump file of a check (an upload again replaces it)."""
        self._run(
            "INSERT INTO fr_dumps (check_id, node, name, data, stored_at) VALUES (?,?,?,?,?)"
            " ON CONFLICT (check_id, node, name) DO UPDATE SET data=excluded.data,"
            " stored_at=excluded.stored_at",
            (check_id, node, name, data, now),
        )

    def fr_dumps(self, check_id: str) -> list[tuple[str, str, bytes]]:
        """(node, file name, bytes) of every dump file of a check, by node and name."""
        return [
            (str(r[0]), str(r[1]), bytes(r[2]))
            for r in self._all(
                "SELECT node, name, data FROM fr_dumps WHERE check_id=? ORDER BY node, name",
                (check_id,),
            )
        ]

    def prune_fr_dumps(self, cutoff: float) -> int:
        """Delete dumps stored before `cutoff` (the events' retention)."""
        return max(self._run("DELETE FROM fr_dumps WHERE stored_at < ?", (cutoff,)).rowcount, 0)

    def audit_log(self, limit: int) -> list[AuditRow]:
        return self._rows(
            AuditRow, f"SELECT {AUDIT_COLS} FROM audit ORDER BY id DESC LIMIT ?", (limit,)
        )
