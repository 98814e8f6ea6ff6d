"""Incidents, their playbook runs and the runs' steps, and each repair's stages."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from sentinel.coordinator.core.rows import (
    DoneStepRow,
    IncidentDetail,
    IncidentRow,
    RepairStagesRow,
    RunContext,
    RunRow,
    StepRow,
)
from sentinel.coordinator.store.base import (
    INCIDENT_COLS,
    RUN_COLS,
    STAGE_COLS,
    STEP_COLS,
    SqlBase,
    detail_json,
    dumps,
    from_row,
    key_ok,
)


class IncidentsRepo(SqlBase):
    def insert_incident(
        self,
        key: str,
        fault: str,
        target: str,
        job: str | None,
        state: str,
        playbook: str,
        now: float,
        first_step: int | None,
        detail: IncidentDetail,
    ) -> int:
        return self._insert_id(
            "INSERT INTO incidents (key, fault, target, job, state, playbook, opened_at,"
            " updated_at, first_step, detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                key,
                fault,
                target,
                job,
                str(state),
                playbook,
                now,
                now,
                first_step,
                detail_json(detail),
            ),
        )

    def incident(self, incident_id: int) -> IncidentRow | None:
        if not key_ok(incident_id):
            return None
        return self._row(
            IncidentRow, f"SELECT {INCIDENT_COLS} FROM incidents WHERE id=?", (incident_id,)
        )

    def active_incident(self, key: str, states: Iterable[str]) -> IncidentRow | None:
        states = [str(s) for s in states]
        row = self._first(
            f"SELECT {INCIDENT_COLS} FROM incidents WHERE key=?"
            f" AND state IN ({','.join('?' * len(states))}) ORDER BY id DESC LIMIT 1",
            (key, *states),
        )
        return None if row is None else from_row(IncidentRow, row)

    def active_incident_on(
        self, target: str, faults: Iterable[str], states: Iterable[str]
    ) -> int | None:
        faults, states = sorted(faults), [str(s) for s in states]
        row = self._first(
            f"SELECT id FROM incidents WHERE target=? AND fault IN ({','.join('?' * len(faults))})"
            f" AND state IN ({','.join('?' * len(states))}) ORDER BY id LIMIT 1",
            (target, *faults, *states),
        )
        return None if row is None else int(row[0])

    def save_incident_detail(self, incident_id: int, detail: IncidentDetail, now: float) -> None:
        self._run(
            "UPDATE incidents SET detail=?, updated_at=? WHERE id=?",
            (detail_json(detail), now, incident_id),
        )

    def acknowledge_incident(self, incident_id: int, who: str, now: float) -> bool:
        if not key_ok(incident_id):
            return False
        cur = self._run(
            "UPDATE incidents SET acknowledged_by=?, updated_at=? WHERE id=?",
            (who, now, incident_id),
        )
        return cur.rowcount == 1

    def relaunching_run(self, job: str, launched_at: float) -> int | None:
        """The run of the job's newest live resume step started by `launched_at` whose run
        has no stages yet: the repair a launch then is the restart of."""
        row = self._first(
            "SELECT a.run_id FROM actions a"
            " JOIN incidents i ON i.id = a.incident_id"
            " LEFT JOIN repair_stages s ON s.run_id = a.run_id"
            " WHERE i.job=? AND a.action='resume' AND a.dry_run=0 AND a.run_id IS NOT NULL"
            " AND a.state IN ('started', 'done') AND a.started_at <= ? AND s.run_id IS NULL"
            " ORDER BY a.started_at DESC LIMIT 1",
            (job, launched_at),
        )
        return None if row is None else int(row[0])

    def incident_steps(self, incident_id: int) -> list[StepRow]:
        return self._rows(
            StepRow,
            f"SELECT {STEP_COLS} FROM actions WHERE incident_id=? ORDER BY id",
            (incident_id,),
        )

    def run_steps(self, run_id: int) -> list[StepRow]:
        return self._rows(
            StepRow, f"SELECT {STEP_COLS} FROM actions WHERE run_id=? ORDER BY id", (run_id,)
        )

    def insert_repair_stages(self, stages: RepairStagesRow) -> None:
        """Once per run: a second report of the same relaunch changes nothing."""
        values = dataclasses.astuple(stages)
        self._run(
            f"INSERT INTO repair_stages ({STAGE_COLS}) VALUES ({','.join('?' * len(values))})"
            " ON CONFLICT (run_id) DO NOTHING",
            values,
        )

    def insert_run(
        self,
        incident_id: int,
        playbook: str,
        status: str,
        dry_run: bool,
        now: float,
        context: RunContext | None = None,
    ) -> int:
        return self._insert_id(
            "INSERT INTO runs (incident_id, playbook, status, context, dry_run, created_at,"
            " updated_at) VALUES (?,?,?,?,?,?,?)",
            (
                incident_id,
                playbook,
                str(status),
                (context or RunContext()).model_dump_json(exclude_defaults=True),
                int(dry_run),
                now,
                now,
            ),
        )

    def run(self, run_id: int) -> RunRow | None:
        if not key_ok(run_id):
            return None
        return self._row(RunRow, f"SELECT {RUN_COLS} FROM runs WHERE id=?", (run_id,))

    def runs(self, statuses: Iterable[str], incident_id: int | None = None) -> list[RunRow]:
        statuses = [str(s) for s in statuses]
        sql = f"SELECT {RUN_COLS} FROM runs WHERE status IN ({','.join('?' * len(statuses))})"
        if incident_id is None:
            return self._rows(RunRow, sql + " ORDER BY id", statuses)
        return self._rows(RunRow, sql + " AND incident_id=? ORDER BY id", (*statuses, incident_id))

    def last_run_update(self, incident_id: int) -> float | None:
        row = self._first("SELECT MAX(updated_at) FROM runs WHERE incident_id=?", (incident_id,))
        return None if row is None or row[0] is None else float(row[0])

    def save_run(self, run: RunRow, now: float) -> None:
        self._run(
            "UPDATE runs SET step_index=?, context=?, step_started_at=?, updated_at=? WHERE id=?",
            (
                run.step_index,
                run.context.model_dump_json(exclude_defaults=True),
                run.step_started_at,
                now,
                run.id,
            ),
        )

    def insert_step(
        self,
        key: str,
        incident_id: int,
        run_id: int,
        action: str,
        params: dict[str, Any],
        state: str,
        dry_run: bool,
        who: str,
        now: float,
    ) -> None:
        self._run(
            "INSERT INTO actions (key, incident_id, run_id, action, params, state, dry_run, who,"
            " started_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (key, incident_id, run_id, action, dumps(params), str(state), int(dry_run), who, now),
        )

    def step(self, key: str) -> StepRow | None:
        return self._row(StepRow, f"SELECT {STEP_COLS} FROM actions WHERE key=?", (key,))

    def done_steps(self, action: str, job_id: str | None = None) -> list[DoneStepRow]:
        """Finished steps of `action` (of the job's incidents, when given), oldest first."""
        sql = (
            "SELECT a.incident_id, i.fault, a.done_at, a.result FROM actions a"
            " JOIN incidents i ON i.id = a.incident_id"
            " WHERE a.action=? AND a.state='done' AND a.dry_run=0"
        )
        if job_id is None:
            return self._rows(DoneStepRow, sql + " ORDER BY a.id", (action,))
        return self._rows(DoneStepRow, sql + " AND i.job=? ORDER BY a.id", (action, job_id))

    def save_step_result(
        self, key: str, result: dict[str, Any], target: str | None, done_at: float | None
    ) -> None:
        self._run(
            "UPDATE actions SET result=?, target=?, done_at=? WHERE key=?",
            (dumps(result), target, done_at, key),
        )
