"""The fleet: nodes (seen, state) and jobs (their supervisor's last report)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Select, Table, bindparam, func, select, update

from sentinel.coordinator.core.rows import JobRow, NodeRow
from sentinel.coordinator.store.base import SqlBase, columns
from sentinel.coordinator.store.schema import jobs, nodes
from sentinel.protocol import JobStatusPayload

_NODE = [nodes.c[n] for n in columns(NodeRow)]
_JOB = [jobs.c[n] for n in columns(JobRow)]


class FleetRepo(SqlBase):
    def touch_nodes(self, seen: dict[str, str | None], now: float) -> None:
        """Mark nodes seen now, with their own verdict where their events carried one; a node
        heard from for the first time starts in the column's default state (active)."""
        # In name order: two coordinators upserting overlapping nodes then lock them in the
        # same order, and neither waits on the other in a cycle (a deadlock).
        if seen:
            self._touch(sorted(seen.items()), now)

    def _touch(self, seen: list[tuple[str, str | None]], now: float) -> None:
        """The upsert of `touch_nodes`: one statement a node, in one executemany."""
        rows = [{"name": n, "last_seen": now, "verdict": v} for n, v in seen]
        self._many(touch_statement(self._insert), rows)

    def insert_node(self, name: str, state: str, now: float, reason: str | None) -> bool:
        new = self._insert(nodes).values(
            name=name, state=str(state), state_changed_at=now, reason=reason
        )
        return bool(self._x(new.on_conflict_do_nothing()) == 1)

    def node(self, name: str) -> NodeRow | None:
        return self._row(NodeRow, select(*_NODE).where(nodes.c.name == name))

    def count_nodes(self, states: Iterable[str], changed_since: float | None = None) -> int:
        counted = select(func.count()).where(nodes.c.state.in_([str(s) for s in states]))
        if changed_since is not None:
            counted = counted.where(nodes.c.state_changed_at >= changed_since)
        return self._count(counted)

    def insert_job(self, job_id: str, state: str, status: JobStatusPayload, now: float) -> None:
        status_json = status.model_dump_json()
        self._x(
            jobs.insert().values(
                id=job_id,
                state=str(state),
                generation=status.generation,
                last_heartbeat=now,
                status=status_json,
            )
        )

    def save_job_status(self, job_id: str, status: JobStatusPayload, now: float) -> None:
        report = dict(
            generation=status.generation, last_heartbeat=now, status=status.model_dump_json()
        )
        self._x(update(jobs).where(jobs.c.id == job_id).values(report))

    def job(self, job_id: str) -> JobRow | None:
        return self._row(JobRow, select(*_JOB).where(jobs.c.id == job_id))

    def jobs(self, limit: int, exclude_states: Iterable[str] = ()) -> list[JobRow]:
        return self._rows(JobRow, _jobs_not_in(exclude_states).order_by(jobs.c.id).limit(limit))

    def silent_jobs(self, before: float, exclude_states: Iterable[str]) -> list[JobRow]:
        return self._rows(
            JobRow, _jobs_not_in(exclude_states).where(jobs.c.last_heartbeat < before)
        )


@functools.cache
def touch_statement(insert: Callable[[Table], Any], source: Any = None) -> Any:
    """The upsert `touch_nodes` runs, in this dialect's insert: of one node's parameters, or of
    every row `source` selects."""
    columns = ("name", "last_seen", "verdict")
    upsert = insert(nodes)
    if source is None:
        upsert = upsert.values({c: bindparam(c) for c in columns})
    else:
        upsert = upsert.from_select(list(columns), source)
    again = {
        "last_seen": upsert.excluded.last_seen,
        "verdict": func.coalesce(upsert.excluded.verdict, nodes.c.verdict),
    }
    return upsert.on_conflict_do_update(index_elements=["name"], set_=again)


def _jobs_not_in(states: Iterable[str]) -> Select[Any]:
    return select(*_JOB).where(jobs.c.state.not_in([str(s) for s in states]))
