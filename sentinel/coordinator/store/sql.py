"""The SQL every backend shares: the domain's reads and writes, written once.

`SqlStore` is the store's interface and its implementation at once. A backend is a subclass in
a module of its own (`sqlite.py`, `postgres.py`) that brings the connection, transactions,
migrations and the few places where dialects differ (`_json_text`, `_json_number`,
`EVENT_CURSOR`, `_insert_id`, `_insert_event_chunk`, `lock_key`). Statements use `?`
placeholders; a backend whose driver wants another style translates them.

What every backend promises:

- `tx()` is a transaction; nested, a savepoint. Everything a method writes inside it commits or
  rolls back with it. Outside one, each write is its own transaction.
- Ids the store assigns are 64-bit integers; an id outside that range names no row (a lookup
  answers None, not an error).
- `set_state` writes only if the row still holds `expected` (compare-and-set), so a writer that
  read a stale state loses instead of overwriting: what several coordinators sharing one
  database need.
- Event arrival order is an opaque integer cursor (SQLite's rowid, a PostgreSQL sequence).
- A lost database raises `StoreUnavailable` (the API answers 503), never a driver's error.

The methods named in `STATE_WRITERS` write a state column. Only `lifecycle.py` calls them.
Typed rows (`rows.py`) are what leaves: no driver's row type crosses this line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from itertools import chain
from typing import Any, Protocol, TypeVar

from pydantic_core import to_json

from sentinel.coordinator.lifecycle import Entity
from sentinel.coordinator.store.interface import MAX_ID
from sentinel.coordinator.store.rows import (
    AuditRow,
    CommandRow,
    DoneStepRow,
    EffectRow,
    EventRow,
    IncidentDetail,
    IncidentRow,
    IncidentView,
    JobRow,
    NewCommand,
    NodeRow,
    PruneResult,
    RepairStagesRow,
    RunContext,
    RunRow,
    StepRow,
    StoredEvent,
    TokenRow,
    from_row,
)
from sentinel.protocol import Event, JobStatusPayload

audit_log = logging.getLogger("sentinel.coordinator.audit")

# Built once: json.dumps with any argument builds a new encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


class Cursor(Protocol):
    """What a statement's result offers, whatever the driver."""

    @property
    def rowcount(self) -> int: ...


class SqlStore(ABC):
    """The coordinator's durable state: every statement it runs, on any backend."""

    # The column that orders events by arrival (see `prune_events`).
    EVENT_CURSOR = "rowid"

    # --- what a backend provides ---------------------------------------------------------

    @abstractmethod
    def tx(self) -> AbstractContextManager[None]:
        """A transaction (nested calls become savepoints): all of it commits, or none of it."""

    @abstractmethod
    def close(self) -> None: ...

    def start_background(self) -> None:  # noqa: B027 (a hook most backends leave empty)
        """Housekeeping threads the backend needs (SQLite: the WAL checkpointer)."""

    def file_sizes(self) -> dict[str, int]:
        """Bytes on this host's disk the store takes (none for a database server)."""
        return {}

    @contextmanager
    def fenced(self, epoch: int) -> Iterator[None]:
        """Writes inside carry the leader's `epoch`; a store several coordinators share refuses
        them once the epoch is stale (`Fenced`). One coordinator's store has nothing to fence."""
        yield

    def lock_key(self, key: str) -> None:  # noqa: B027 (one writer needs nothing)
        """Serialize, until the transaction ends, every writer that takes the same key: two
        coordinators ingesting the same fault at once must open one incident, not two. One
        writer (SQLite) needs nothing."""

    @abstractmethod
    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    @abstractmethod
    def _first(self, sql: str, params: Sequence[Any] = ()) -> Any | None: ...

    @abstractmethod
    def _run(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Run one statement; the result has the driver's `rowcount`."""

    @abstractmethod
    def _runmany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    @abstractmethod
    def _insert_id(self, sql: str, params: Sequence[Any]) -> int:
        """Run an INSERT of one row; the id the database gave it."""

    @abstractmethod
    def _json_text(self, column: str, key: str) -> str:
        """SQL for a JSON column's top-level field, as text."""

    @abstractmethod
    def _json_number(self, column: str, key: str) -> str:
        """SQL for a JSON column's top-level field, as a number."""

    @abstractmethod
    def _dicts(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Rows as {column: value}, for `query`."""

    # Ad-hoc reads and writes for tests and operators inspecting a store; the coordinator
    # itself uses only the typed methods below.
    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return [_decode_json(row) for row in self._dicts(sql, params)]

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> dict[str, Any] | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Cursor:
        return self._run(sql, params)

    def _row(self, cls: type[_R], sql: str, params: Sequence[Any] = ()) -> _R | None:
        row = self._first(sql, params)
        return None if row is None else from_row(cls, row)

    def _rows(self, cls: type[_R], sql: str, params: Sequence[Any] = ()) -> list[_R]:
        return [from_row(cls, r) for r in self._all(sql, params)]

    def _count(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self._first(sql, params)
        return int(row[0]) if row is not None and row[0] is not None else 0

    def _sdc_rows(self) -> str:
        return (
            f"SELECT {_EVENT_COLS} FROM events WHERE kind='rank.sdc'"
            f" AND COALESCE({self._json_text('payload', 'check')},'matmul')='matmul'"
        )

    # --- state -----------------------------------------------------------------------------

    def state_of(self, entity: Entity, key: str | int) -> str | None:
        table, col, _ = _STATE_COLUMNS[entity]
        if not _key_ok(key):
            return None
        row = self._first(f"SELECT {col} FROM {table} WHERE {_KEYS[entity]}=?", (key,))
        return None if row is None else str(row[0])

    def set_state(
        self,
        entity: Entity,
        key: str | int,
        state: str,
        now: float,
        expected: str,
        reason: str | None = None,
    ) -> bool:
        table, col, stamp = _STATE_COLUMNS[entity]
        sets, params = [f"{col}=?"], [str(state)]
        if stamp:
            sets.append(f"{stamp}=?")
            params.append(now)  # type: ignore[arg-type]
        if reason is not None and entity is Entity.NODE:
            sets.append("reason=?")
            params.append(reason)
        cur = self._run(
            f"UPDATE {table} SET {', '.join(sets)} WHERE {_KEYS[entity]}=? AND {col}=?",
            (*params, key, str(expected)),
        )
        return cur.rowcount == 1

    def state_counts(self, entity: Entity) -> dict[str, int]:
        table, col, _ = _STATE_COLUMNS[entity]
        return {
            str(r[0]): int(r[1])
            for r in self._all(f"SELECT {col}, COUNT(*) FROM {table} GROUP BY {col}")
        }

    # --- events ----------------------------------------------------------------------------

    def insert_events(self, events: Sequence[Event], received_at: float) -> set[str]:
        """Store the events not stored yet (by id); the ids stored now. Chunks of fixed sizes
        (256, then powers of two) keep the statements few and each one prepared before."""
        new: set[str] = set()
        rows = [  # a kind is a str enum: the driver stores its value (no Python `.value` call)
            (
                ev.id,
                ev.kind,
                ev.source.node,
                ev.source.rank,
                ev.source.job,
                ev.ts,
                to_json(ev.payload).decode(),
                received_at,
            )
            for ev in events
        ]
        for chunk in _chunks(rows):
            new.update(self._insert_event_chunk(chunk))
        return new

    @abstractmethod
    def _insert_event_chunk(self, chunk: list[tuple[Any, ...]]) -> Iterable[str]:
        """Insert these event rows, skipping ids stored already; the ids inserted."""

    def link_events(self, links: Iterable[tuple[str, int]]) -> None:
        self._runmany("UPDATE events SET incident_id=? WHERE id=?", [(i, e) for e, i in links])

    def events_from(
        self, who: str, value: str, kinds: Sequence[str], since: float, limit: int
    ) -> list[StoredEvent]:
        column = {"node": "node", "job": "job"}[who]
        marks = ",".join("?" * len(kinds))
        return self._rows(
            StoredEvent,
            f"SELECT {_EVENT_COLS} FROM events WHERE {column}=? AND kind IN ({marks})"
            " AND ts>=? LIMIT ?",
            (value, *kinds, since, limit),
        )

    def sdc_digests(
        self, job: str, check_id: str, since: float, after_step: int
    ) -> list[StoredEvent]:
        return [
            from_row(StoredEvent, r)
            for r in self._all(
                self._sdc_rows() + f" AND job=? AND ({self._json_text('payload', 'check_id')}=?"
                f" OR (received_at>=? AND {self._json_number('payload', 'step')}>?))",
                (job, check_id, since, after_step),
            )
        ]

    def sdc_digests_of_incident(self, incident_id: int) -> list[StoredEvent]:
        if not _key_ok(incident_id):
            return []
        return self._rows(StoredEvent, self._sdc_rows() + " AND incident_id=?", (incident_id,))

    def fr_analysis(self, job: str, check_id: str) -> StoredEvent | None:
        """The job's latest analysis of the flight-recorder check `check_id`."""
        return self._answer("fr.analysis", ("job", job), ("check_id", check_id), "ts DESC")

    def _answer(
        self, kind: str, scope: tuple[str, str], key: tuple[str, str], order: str
    ) -> StoredEvent | None:
        """One event of `kind` from `scope` (a column and its value) whose payload field
        `key[0]` is `key[1]`: an answer to the request that field names."""
        return self._row(
            StoredEvent,
            f"SELECT {_EVENT_COLS} FROM events WHERE kind=? AND {scope[0]}=?"
            f" AND {self._json_text('payload', key[0])}=? ORDER BY {order} LIMIT 1",
            (kind, scope[1], key[1]),
        )

    def node_verdicts(self, node: str, since: float) -> list[tuple[float, str]]:
        """(arrival time, verdict) of the node's own verdicts and heartbeats since `since`,
        oldest first: the coordinator's record of how healthy its agent said it was."""
        verdict = self._json_text("payload", "verdict")
        rows = self._all(
            f"SELECT received_at, {verdict} FROM events WHERE kind IN"
            " ('node.verdict','agent.heartbeat') AND node=? AND received_at>=?"
            " ORDER BY received_at",
            (node, since),
        )
        return [(float(r[0]), str(r[1])) for r in rows]

    def node_validation(self, node: str, request_id: str) -> StoredEvent | None:
        """The node's answer to the `node.validate` named `request_id`, if it came."""
        return self._answer(
            "node.validation", ("node", node), ("request_id", request_id), "received_at"
        )

    def rank_stacks(self, job: str, request_id: str) -> list[StoredEvent]:
        """The ranks' `rank.stacks` answers to one stacks request, oldest first."""
        return [
            from_row(StoredEvent, r)
            for r in self._all(
                f"SELECT {_EVENT_COLS} FROM events WHERE kind='rank.stacks' AND job=?"
                f" AND {self._json_text('payload', 'request_id')}=? ORDER BY received_at, id",
                (job, request_id),
            )
        ]

    def prune_events(self, after: int, cutoff: float, chunk: int) -> PruneResult:
        """Rows go in cursor order, which is arrival order: walk from the cursor a chunk at a
        time, and stop at the first row that arrived after the cutoff."""
        cursor = self.EVENT_CURSOR
        rows = self._all(
            f"SELECT {cursor}, received_at FROM events WHERE {cursor} > ? ORDER BY {cursor} LIMIT ?",
            (after, chunk),
        )
        upto = None
        for position, received in rows:
            if received >= cutoff:
                break
            upto = int(position)
        if upto is None:
            return PruneResult(0, after, False)
        with self.tx():
            cur = self._run(
                f"DELETE FROM events WHERE {cursor} > ? AND {cursor} <= ? AND incident_id IS NULL",
                (after, upto),
            )
        backlog = len(rows) == chunk and upto == int(rows[-1][0])
        return PruneResult(max(cur.rowcount, 0), upto, backlog)

    # --- nodes -----------------------------------------------------------------------------

    def touch_nodes(self, seen: dict[str, str | None], now: float) -> None:
        # One statement per chunk, not one step per node: every statement the store thread runs
        # hands the GIL back and forth with the event loop, which costs most under load.
        # In name order: two coordinators upserting overlapping nodes then lock them in the
        # same order, and neither waits on the other in a cycle (a deadlock).
        rows = [(node, now, verdict) for node, verdict in sorted(seen.items())]
        for chunk in _chunks(rows):
            self._run(
                _values_sql(_UPSERT_NODES, "(?,?,?)", len(chunk), _UPSERT_NODES_TAIL),
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
        return self._row(NodeRow, f"SELECT {_NODE_COLS} FROM nodes WHERE name=?", (name,))

    def nodes(self, limit: int) -> list[NodeRow]:
        return self._rows(
            NodeRow, f"SELECT {_NODE_COLS} FROM nodes ORDER BY name LIMIT ?", (limit,)
        )

    def count_nodes(self, states: Iterable[str], changed_since: float | None = None) -> int:
        states = [str(s) for s in states]
        sql = f"SELECT COUNT(*) FROM nodes WHERE state IN ({','.join('?' * len(states))})"
        if changed_since is None:
            return self._count(sql, states)
        return self._count(sql + " AND state_changed_at >= ?", (*states, changed_since))

    # --- jobs ------------------------------------------------------------------------------

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
        return self._row(JobRow, f"SELECT {_JOB_COLS} FROM jobs WHERE id=?", (job_id,))

    def jobs(self, limit: int, exclude_states: Iterable[str] = ()) -> list[JobRow]:
        where, states = _jobs_not_in(exclude_states)
        return self._rows(JobRow, where + " ORDER BY id LIMIT ?", (*states, limit))

    def silent_jobs(self, before: float, exclude_states: Iterable[str]) -> list[JobRow]:
        where, states = _jobs_not_in(exclude_states)
        return self._rows(JobRow, where + " AND last_heartbeat < ?", (*states, before))

    # --- incidents -------------------------------------------------------------------------

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
            (key, fault, target, job, str(state), playbook, now, now, first_step, _detail(detail)),
        )

    def incident(self, incident_id: int) -> IncidentRow | None:
        if not _key_ok(incident_id):
            return None
        return self._row(
            IncidentRow, f"SELECT {_INCIDENT_COLS} FROM incidents WHERE id=?", (incident_id,)
        )

    def incidents(self, limit: int, state: str | None = None) -> list[IncidentRow]:
        if state is None:
            rows = self._all(
                f"SELECT {_INCIDENT_COLS} FROM incidents ORDER BY id LIMIT ?", (limit,)
            )
        else:
            rows = self._all(
                f"SELECT {_INCIDENT_COLS} FROM incidents WHERE state=? ORDER BY id LIMIT ?",
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
        steps = self._all(
            f"SELECT {_STEP_COLS} FROM actions WHERE incident_id=? ORDER BY id", (incident_id,)
        )
        audit = self._all(
            f"SELECT {_AUDIT_COLS} FROM audit WHERE incident_id=? ORDER BY id", (incident_id,)
        )
        runs = self._all(
            f"SELECT {_RUN_COLS} FROM runs WHERE incident_id=? ORDER BY id", (incident_id,)
        )
        return IncidentView(
            incident,
            events,
            [from_row(RunRow, r) for r in runs],
            [from_row(StepRow, r) for r in steps],
            [from_row(AuditRow, r) for r in audit],
            self.repair_stages(incident_id),
        )

    def active_incident(self, key: str, states: Iterable[str]) -> IncidentRow | None:
        states = [str(s) for s in states]
        row = self._first(
            f"SELECT {_INCIDENT_COLS} FROM incidents WHERE key=?"
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
            (_detail(detail), now, incident_id),
        )

    def acknowledge_incident(self, incident_id: int, who: str, now: float) -> bool:
        if not _key_ok(incident_id):
            return False
        cur = self._run(
            "UPDATE incidents SET acknowledged_by=?, updated_at=? WHERE id=?",
            (who, now, incident_id),
        )
        return cur.rowcount == 1

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

    # --- repair stages -----------------------------------------------------------------------

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

    def run_steps(self, run_id: int) -> list[StepRow]:
        return self._rows(
            StepRow, f"SELECT {_STEP_COLS} FROM actions WHERE run_id=? ORDER BY id", (run_id,)
        )

    def first_event_ts(self, incident_id: int) -> float | None:
        row = self._first("SELECT MIN(ts) FROM events WHERE incident_id=?", (incident_id,))
        return None if row is None or row[0] is None else float(row[0])

    def insert_repair_stages(self, stages: RepairStagesRow) -> None:
        """Once per run: a second report of the same relaunch changes nothing."""
        values = dataclasses.astuple(stages)
        self._run(
            f"INSERT INTO repair_stages ({_STAGE_COLS}) VALUES ({','.join('?' * len(values))})"
            " ON CONFLICT (run_id) DO NOTHING",
            values,
        )

    def repair_stages(self, incident_id: int | None = None) -> list[RepairStagesRow]:
        """One incident's repairs' stages, or every repair's (`/metrics`)."""
        if incident_id is None:
            return self._rows(
                RepairStagesRow, f"SELECT {_STAGE_COLS} FROM repair_stages ORDER BY run_id"
            )
        return self._rows(
            RepairStagesRow,
            f"SELECT {_STAGE_COLS} FROM repair_stages WHERE incident_id=? ORDER BY run_id",
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
        if not _key_ok(run_id):
            return None
        return self._row(RunRow, f"SELECT {_RUN_COLS} FROM runs WHERE id=?", (run_id,))

    def runs(self, statuses: Iterable[str], incident_id: int | None = None) -> list[RunRow]:
        statuses = [str(s) for s in statuses]
        sql = f"SELECT {_RUN_COLS} FROM runs WHERE status IN ({','.join('?' * len(statuses))})"
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
            (key, incident_id, run_id, action, _dumps(params), str(state), int(dry_run), who, now),
        )

    def step(self, key: str) -> StepRow | None:
        return self._row(StepRow, f"SELECT {_STEP_COLS} FROM actions WHERE key=?", (key,))

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

    def steps(self, limit: int) -> list[StepRow]:
        return self._rows(
            StepRow, f"SELECT {_STEP_COLS} FROM actions ORDER BY id LIMIT ?", (limit,)
        )

    def save_step_result(
        self, key: str, result: dict[str, Any], target: str | None, done_at: float | None
    ) -> None:
        self._run(
            "UPDATE actions SET result=?, target=?, done_at=? WHERE key=?",
            (_dumps(result), target, done_at, key),
        )

    # --- outside effects -------------------------------------------------------------------

    def insert_effect(
        self,
        key: str,
        kind: str,
        target: str,
        args: dict[str, Any],
        state: str,
        incident_id: int | None,
        now: float,
    ) -> EffectRow:
        self._run(
            "INSERT INTO effects (key, kind, target, args, state, incident_id, created_at)"
            " VALUES (?,?,?,?,?,?,?) ON CONFLICT(key) DO NOTHING",
            (key, kind, target, _dumps(args), str(state), incident_id, now),
        )
        row = self.effect(key)
        assert row is not None
        return row

    def effect(self, key: str) -> EffectRow | None:
        return self._row(EffectRow, f"SELECT {_EFFECT_COLS} FROM effects WHERE key=?", (key,))

    def effects(self, states: Iterable[str]) -> list[EffectRow]:
        states = [str(s) for s in states]
        return [
            from_row(EffectRow, r)
            for r in self._all(
                f"SELECT {_EFFECT_COLS} FROM effects"
                f" WHERE state IN ({','.join('?' * len(states))}) ORDER BY id",
                states,
            )
        ]

    def begin_effect(self, key: str) -> int:
        with self.tx():
            before = self._count("SELECT attempts FROM effects WHERE key=?", (key,))
            self._run("UPDATE effects SET attempts=attempts+1 WHERE key=?", (key,))
        return before

    def save_effect_result(self, key: str, result: dict[str, Any], now: float) -> None:
        self._run("UPDATE effects SET result=?, done_at=? WHERE key=?", (_dumps(result), now, key))

    # --- commands --------------------------------------------------------------------------

    def insert_commands(self, commands: Sequence[NewCommand]) -> None:
        self._runmany(
            "INSERT INTO commands (id, target_kind, target, kind, args, created_at,"
            " incident_id) VALUES (?,?,?,?,?,?,?) ON CONFLICT (id) DO NOTHING",
            [
                (
                    c.id,
                    c.target_kind,
                    c.target,
                    c.kind,
                    _dumps(c.args),
                    c.created_at,
                    c.incident_id,
                )
                for c in commands
            ],
        )

    def command(self, command_id: str) -> CommandRow | None:
        return self._row(
            CommandRow, f"SELECT {_COMMAND_COLS} FROM commands WHERE id=?", (command_id,)
        )

    def take_commands(self, target_kind: str, target: str, now: float) -> list[CommandRow]:
        rows = self._all(
            f"SELECT {_COMMAND_COLS} FROM commands WHERE target_kind=? AND target=?"
            " AND acked_at IS NULL ORDER BY created_at, id",
            (target_kind, target),
        )
        if rows:
            with self.tx():
                self._run(
                    "UPDATE commands SET delivered_at=? WHERE target_kind=? AND target=?"
                    " AND delivered_at IS NULL",
                    (now, target_kind, target),
                )
        return [from_row(CommandRow, r) for r in rows]

    def ack_command(self, command_id: str, result: dict[str, Any], now: float) -> bool:
        cur = self._run(
            "UPDATE commands SET acked_at=?, result=? WHERE id=? AND acked_at IS NULL",
            (now, _dumps(result), command_id),
        )
        return cur.rowcount == 1

    def has_undelivered_commands(self) -> bool:
        return self._first("SELECT 1 FROM commands WHERE delivered_at IS NULL LIMIT 1") is not None

    # --- flight-recorder dumps ------------------------------------------------------------

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

    # --- audit -----------------------------------------------------------------------------

    def audit(
        self,
        now: float,
        who: str,
        what: str,
        why: str,
        incident_id: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self._run(
            "INSERT INTO audit (ts, who, what, why, incident_id, detail) VALUES (?,?,?,?,?,?)",
            (now, who, what, why, incident_id, _dumps(detail or {})),
        )
        # Every audited act (an incident opened, a playbook step and its outcome, an eviction, a
        # spare swap, a refusal, an operator's action) is also one log line, for whoever tails
        # the coordinator's journal.
        audit_log.info(
            "%s: %s", what, why, extra={"incident": incident_id, "by": who, "detail": detail or {}}
        )

    def audit_log(self, limit: int) -> list[AuditRow]:
        return self._rows(
            AuditRow, f"SELECT {_AUDIT_COLS} FROM audit ORDER BY id DESC LIMIT ?", (limit,)
        )

    # --- tokens ----------------------------------------------------------------------------

    def insert_token(
        self, token_id: str, hashed: str, role: str, node: str | None, job: str | None, now: float
    ) -> bool:
        with self.tx():
            cur = self._run(
                "INSERT INTO tokens (id, hash, role, node, job, created_at)"
                " VALUES (?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
                (token_id, hashed, str(role), node, job, now),
            )
        return cur.rowcount == 1

    def token(self, token_id: str) -> TokenRow | None:
        return self._row(
            TokenRow,
            f"SELECT {_TOKEN_COLS} FROM tokens WHERE id=? AND revoked_at IS NULL",
            (token_id,),
        )

    def tokens(self) -> list[TokenRow]:
        return self._rows(TokenRow, f"SELECT {_TOKEN_COLS} FROM tokens ORDER BY created_at")

    def revoke_token(self, token_id: str, now: float) -> bool:
        with self.tx():
            cur = self._run(
                "UPDATE tokens SET revoked_at=? WHERE id=? AND revoked_at IS NULL", (now, token_id)
            )
        return cur.rowcount > 0

    def count_tokens(self, revoked: bool) -> int:
        return self._count(
            "SELECT COUNT(*) FROM tokens WHERE revoked_at IS " + ("NOT NULL" if revoked else "NULL")
        )


# entity -> (table, state column, column stamped with the time of a move)
_STATE_COLUMNS: dict[Entity, tuple[str, str, str | None]] = {
    Entity.INCIDENT: ("incidents", "state", "updated_at"),
    Entity.RUN: ("runs", "status", "updated_at"),
    Entity.STEP: ("actions", "state", None),
    Entity.NODE: ("nodes", "state", "state_changed_at"),
    Entity.JOB: ("jobs", "state", None),
    Entity.EFFECT: ("effects", "state", None),
}
_KEYS: dict[Entity, str] = {
    Entity.INCIDENT: "id",
    Entity.RUN: "id",
    Entity.STEP: "key",
    Entity.NODE: "name",
    Entity.JOB: "id",
    Entity.EFFECT: "key",
}


def _key_ok(key: str | int) -> bool:
    """An integer key a 64-bit column can hold: larger ones name no row (and would overflow)."""
    return not isinstance(key, int) or -MAX_ID - 1 <= key <= MAX_ID


_NODE_COLS = "name, last_seen, verdict, state, state_changed_at, reason"
_JOB_COLS = "id, state, generation, last_heartbeat, status"
_INCIDENT_COLS = (
    "id, key, fault, target, job, state, playbook, opened_at, updated_at, first_step,"
    " acknowledged_by, detail"
)
_RUN_COLS = (
    "id, incident_id, playbook, status, step_index, context, dry_run, created_at, updated_at,"
    " step_started_at"
)
_STEP_COLS = (
    "id, key, incident_id, run_id, action, target, params, state, result, dry_run, who,"
    " started_at, done_at"
)
_AUDIT_COLS = "id, ts, who, what, why, incident_id, detail"
_COMMAND_COLS = (
    "id, target_kind, target, kind, args, created_at, delivered_at, acked_at, result, incident_id"
)
_TOKEN_COLS = "id, hash, role, node, job, created_at, revoked_at"
_EFFECT_COLS = (
    "id, key, kind, target, args, state, attempts, result, incident_id, created_at, done_at"
)
_EVENT_COLS = "id, kind, node, rank, job, ts, payload"
_STAGE_COLS = ", ".join(f.name for f in dataclasses.fields(RepairStagesRow))


_JSON_COLUMNS = frozenset({"payload", "status", "detail", "context", "params", "result", "args"})


def _decode_json(row: dict[str, Any]) -> dict[str, Any]:
    for key in _JSON_COLUMNS & row.keys():
        value = row[key]
        if isinstance(value, str) and value[:1] in ("{", "["):  # runs.status is plain text
            row[key] = json.loads(value)
    return row


def _jobs_not_in(states: Iterable[str]) -> tuple[str, list[str]]:
    """The jobs in none of these states: (SQL, its parameters)."""
    out = [str(s) for s in states]
    return f"SELECT {_JOB_COLS} FROM jobs WHERE state NOT IN ({','.join('?' * len(out))})", out


def _detail(detail: IncidentDetail) -> str:
    return detail.model_dump_json(exclude_none=True)


_CHUNK = 256  # rows per INSERT statement at most (8 parameters each for events)
# A node heard from for the first time starts in the column's default state (active).
_UPSERT_NODES = "INSERT INTO nodes (name, last_seen, verdict) VALUES "
_UPSERT_NODES_TAIL = (
    " ON CONFLICT(name) DO UPDATE SET last_seen=excluded.last_seen,"
    " verdict=COALESCE(excluded.verdict, nodes.verdict)"
)
_T = TypeVar("_T")
_R = TypeVar("_R")


def _chunks(rows: list[_T]) -> Iterator[list[_T]]:
    """`rows` in chunks of fixed sizes (256, then powers of two): few statements, each of a
    size seen before, so the driver's statement cache keeps them prepared."""
    start = 0
    while start < len(rows):
        size = _CHUNK
        while size > len(rows) - start:
            size //= 2
        yield rows[start : start + size]
        start += size


@functools.cache
def _values_sql(head: str, row: str, size: int, tail: str = "") -> str:
    return head + ",".join([row] * size) + tail


dumps = _dumps
