"""The fleet: nodes (seen, state) and jobs (their supervisor's last report)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain

from sentinel.coordinator.core.rows import (
    JobRow,
    NodeRow,
)
from sentinel.coordinator.store.base import (
    JOB_COLS,
    NODE_COLS,
    SqlBase,
    chunks,
    jobs_not_in,
    values_sql,
)
from sentinel.protocol import JobStatusPayload

# A node heard from for the first time starts in the column's default state (active).
_UPSERT_NODES = "INSERT INTO nodes (name, last_seen, verdict) VALUES "
_UPSERT_NODES_TAIL = (
    " ON CONFLICT(name) DO UPDATE SET last_seen=excluded.last_seen,"
    " verdict=COALESCE(excluded.verdict, nodes.verdict)"
)


class FleetRepo(SqlBase):
    def touch_nodes(self, seen: dict[str, str | None], now: float) -> None:
        # One statement per chunk, not one step per node: every statement the store thread runs
        # hands the GIL back and forth with the event loop, which costs most under load.
        # In name order: two coordinators upserting overlapping nodes then lock them in the
        # same order, and neither waits on the other in a cycle (a deadlock).
        rows = [(node, now, verdict) for node, verdict in sorted(seen.items())]
        for chunk in chunks(rows):
            self._run(
                values_sql(_UPSERT_NODES, "(?,?,?)", len(chunk), _UPSERT_NODES_TAIL),
                tuple(chain.from_iterable(chunk)),
            )

    def insert_node(self, name: str, state: str, now: float, reason: str | None) -> bool:
        cur = self._run(
            "INSERT INTO nodes (name, state, state_changed_at, reason) VALUES (?,?,?,?)"
            " ON CONFLICT(name) DO NOTHING",
            (name, str(state), now, reason),
        )
        return cur.rowcount == 1

    def node(self, name: str) -> NodeRow | None:
        return self._row(NodeRow, f"SELECT {NODE_COLS} FROM nodes WHERE name=?", (name,))

    def count_nodes(self, states: Iterable[str], changed_since: float | None = None) -> int:
        states = [str(s) for s in states]
        sql = f"SELECT COUNT(*) FROM nodes WHERE state IN ({','.join('?' * len(states))})"
        if changed_since is None:
            return self._count(sql, states)
        return self._count(sql + " AND state_changed_at >= ?", (*states, changed_since))

    def insert_job(self, job_id: str, state: str, status: JobStatusPayload, now: float) -> None:
        self._run(
            "INSERT INTO jobs (id, state, generation, last_heartbeat, status) VALUES (?,?,?,?,?)",
            (job_id, str(state), status.generation, now, status.model_dump_json()),
        )

    def save_job_status(self, job_id: str, status: JobStatusPayload, now: float) -> None:
        self._run(
            "UPDATE jobs SET generation=?, last_heartbeat=?, status=? WHERE id=?",
            (status.generation, now, status.model_dump_json(), job_id),
        )

    def job(self, job_id: str) -> JobRow | None:
        return self._row(JobRow, f"SELECT {JOB_COLS} FROM jobs WHERE id=?", (job_id,))

    def jobs(self, limit: int, exclude_states: Iterable[str] = ()) -> list[JobRow]:
        where, states = jobs_not_in(exclude_states)
        return self._rows(JobRow, where + " ORDER BY id LIMIT ?", (*states, limit))

    def silent_jobs(self, before: float, exclude_states: Iterable[str]) -> list[JobRow]:
        where, states = jobs_not_in(exclude_states)
        return self._rows(JobRow, where + " AND last_heartbeat < ?", (*states, before))
