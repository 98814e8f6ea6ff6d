"""Incidents, their playbook runs and the runs' steps, and each repair's stages."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select, update

from sentinel.coordinator.core.rows import (
    DoneStepRow,
    IncidentDetail,
    IncidentRow,
    RepairStagesRow,
    RunContext,
    RunRow,
    StepRow,
)
from sentinel.coordinator.store.base import SqlBase, columns, dumps, key_ok
from sentinel.coordinator.store.schema import actions, incidents, repair_stages, runs

INCIDENT = [incidents.c[n] for n in columns(IncidentRow)]
RUN = [runs.c[n] for n in columns(RunRow)]
STEP = [actions.c[n] for n in columns(StepRow)]
STAGES = [repair_stages.c[n] for n in columns(RepairStagesRow)]


def detail_json(detail: IncidentDetail) -> str:
    return detail.model_dump_json(exclude_none=True)


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
        row = incidents.insert().values(
            key=key,
            fault=fault,
            target=target,
            job=job,
            state=str(state),
            playbook=playbook,
            opened_at=now,
            updated_at=now,
            first_step=first_step,
            detail=detail_json(detail),
        )
        return int(self._x(row.returning(incidents.c.id))[0][0])

    def incident(self, incident_id: int) -> IncidentRow | None:
        if not key_ok(incident_id):
            return None
        return self._row(IncidentRow, select(*INCIDENT).where(incidents.c.id == incident_id))

    def active_incident(self, key: str, states: Iterable[str]) -> IncidentRow | None:
        active = incidents.c.state.in_([str(s) for s in states])
        found = select(*INCIDENT).where(incidents.c.key == key, active)
        return self._row(IncidentRow, found.order_by(incidents.c.id.desc()).limit(1))

    def active_incident_on(
        self, target: str, faults: Iterable[str], states: Iterable[str]
    ) -> int | None:
        found = select(incidents.c.id).where(
            incidents.c.target == target,
            incidents.c.fault.in_(sorted(faults)),
            incidents.c.state.in_([str(s) for s in states]),
        )
        held = self._scalar(found.order_by(incidents.c.id).limit(1))
        return None if held is None else int(held)

    def save_incident_detail(self, incident_id: int, detail: IncidentDetail, now: float) -> None:
        saved = dict(detail=detail_json(detail), updated_at=now)
        self._x(update(incidents).where(incidents.c.id == incident_id).values(saved))

    def acknowledge_incident(self, incident_id: int, who: str, now: float) -> bool:
        if not key_ok(incident_id):
            return False
        seen = dict(acknowledged_by=who, updated_at=now)
        return bool(
            self._x(update(incidents).where(incidents.c.id == incident_id).values(seen)) == 1
        )

    # --- runs and steps --------------------------------------------------------------------

    def insert_run(
        self,
        incident_id: int,
        playbook: str,
        status: str,
        dry_run: bool,
        now: float,
        context: RunContext | None = None,
    ) -> int:
        context_json = (context or RunContext()).model_dump_json(exclude_defaults=True)
        row = runs.insert().values(
            incident_id=incident_id,
            playbook=playbook,
            status=str(status),
            context=context_json,
            dry_run=int(dry_run),
            created_at=now,
            updated_at=now,
        )
        return int(self._x(row.returning(runs.c.id))[0][0])

    def run(self, run_id: int) -> RunRow | None:
        if not key_ok(run_id):
            return None
        return self._row(RunRow, select(*RUN).where(runs.c.id == run_id))

    def runs(self, statuses: Iterable[str], incident_id: int | None = None) -> list[RunRow]:
        found = select(*RUN).where(runs.c.status.in_([str(s) for s in statuses]))
        if incident_id is not None:
            found = found.where(runs.c.incident_id == incident_id)
        return self._rows(RunRow, found.order_by(runs.c.id))

    def last_run_update(self, incident_id: int) -> float | None:
        last = self._scalar(
            select(func.max(runs.c.updated_at)).where(runs.c.incident_id == incident_id)
        )
        return None if last is None else float(last)

    def save_run(self, run: RunRow, now: float) -> None:
        saved = dict(
            step_index=run.step_index,
            context=run.context.model_dump_json(exclude_defaults=True),
            step_started_at=run.step_started_at,
            updated_at=now,
        )
        self._x(update(runs).where(runs.c.id == run.id).values(saved))

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
        self._x(
            actions.insert().values(
                key=key,
                incident_id=incident_id,
                run_id=run_id,
                action=action,
                params=dumps(params),
                state=str(state),
                dry_run=int(dry_run),
                who=who,
                started_at=now,
            )
        )

    def step(self, key: str) -> StepRow | None:
        return self._row(StepRow, select(*STEP).where(actions.c.key == key))

    def done_steps(self, action: str, job_id: str | None = None) -> list[DoneStepRow]:
        """Finished steps of `action` (of the job's incidents, when given), oldest first."""
        found = (
            select(actions.c.incident_id, incidents.c.fault, actions.c.done_at, actions.c.result)
            .join(incidents, incidents.c.id == actions.c.incident_id)
            .where(actions.c.action == action, actions.c.state == "done", actions.c.dry_run == 0)
        )
        if job_id is not None:
            found = found.where(incidents.c.job == job_id)
        return self._rows(DoneStepRow, found.order_by(actions.c.id))

    def save_step_result(
        self, key: str, result: dict[str, Any], target: str | None, done_at: float | None
    ) -> None:
        saved = dict(result=dumps(result), target=target, done_at=done_at)
        self._x(update(actions).where(actions.c.key == key).values(saved))

    def incident_steps(self, incident_id: int) -> list[StepRow]:
        found = select(*STEP).where(actions.c.incident_id == incident_id)
        return self._rows(StepRow, found.order_by(actions.c.id))

    def run_steps(self, run_id: int) -> list[StepRow]:
        return self._rows(
            StepRow, select(*STEP).where(actions.c.run_id == run_id).order_by(actions.c.id)
        )

    # --- repair stages ---------------------------------------------------------------------

    def relaunching_run(self, job: str, launched_at: float) -> int | None:
        """The run of the job's newest live resume step started by `launched_at` whose run
        has no stages yet: the repair a launch then is the restart of."""
        found = (
            select(actions.c.run_id)
            .join(incidents, incidents.c.id == actions.c.incident_id)
            .outerjoin(repair_stages, repair_stages.c.run_id == actions.c.run_id)
            .where(
                incidents.c.job == job,
                actions.c.action == "resume",
                actions.c.dry_run == 0,
                actions.c.run_id.is_not(None),
                actions.c.state.in_(("started", "done")),
                actions.c.started_at <= launched_at,
                repair_stages.c.run_id.is_(None),
            )
            .order_by(actions.c.started_at.desc())
            .limit(1)
        )
        run_id = self._scalar(found)
        return None if run_id is None else int(run_id)

    def insert_repair_stages(self, stages: RepairStagesRow) -> None:
        """Once per run: a second report of the same relaunch changes nothing."""
        row = self._insert(repair_stages).values(dataclasses.asdict(stages))
        self._x(row.on_conflict_do_nothing(index_elements=["run_id"]))
