"""The embedded store backend: SQLite in WAL mode, schema versioned with migrations.

It implements `interface.StateStore`; every SQL statement the coordinator runs on SQLite is
here, and typed rows (`rows.py`) are what leaves.

One connection, used by one thread at a time (the coordinator funnels every call through a
single-thread executor). Commits use `synchronous=FULL`, so a committed transaction survives
kill -9 and power loss; the API acknowledges an event only after its transaction committed.
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar

from pydantic_core import to_json

from sentinel.coordinator.lifecycle import (
    EffectState,
    Entity,
    IncidentState,
    NodeState,
    RunState,
    StepState,
)
from sentinel.coordinator.store.interface import MAX_ID
from sentinel.coordinator.store.rows import (
    AuditRow,
    CommandRow,
    EffectRow,
    EventRow,
    IncidentDetail,
    IncidentRow,
    IncidentView,
    JobRow,
    NewCommand,
    NodeRow,
    PruneResult,
    RunContext,
    RunRow,
    StepRow,
    StoredEvent,
    TokenRow,
)
from sentinel.protocol import Event, JobState, JobStatusPayload

audit_log = logging.getLogger("sentinel.coordinator.audit")

# Each entry moves the schema from version i to i+1. Append; never edit a shipped entry.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE events (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL, node TEXT, rank INTEGER, job TEXT,
        ts REAL NOT NULL, payload TEXT NOT NULL, received_at REAL NOT NULL, incident_id INTEGER
    );
    CREATE INDEX events_incident ON events(incident_id);
    CREATE INDEX events_kind_node ON events(kind, node, ts);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY, last_seen REAL, verdict TEXT, state TEXT NOT NULL DEFAULT 'active',
        state_changed_at REAL, reason TEXT
    );
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY, state TEXT NOT NULL, generation INTEGER NOT NULL DEFAULT 0,
        last_heartbeat REAL, status TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE incidents (
        id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, fault TEXT NOT NULL,
        target TEXT NOT NULL, job TEXT, state TEXT NOT NULL, playbook TEXT,
        opened_at REAL NOT NULL, updated_at REAL NOT NULL, first_step INTEGER,
        acknowledged_by TEXT, detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX incidents_key ON incidents(key, state);
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT, incident_id INTEGER NOT NULL, playbook TEXT NOT NULL,
        status TEXT NOT NULL, step_index INTEGER NOT NULL DEFAULT 0,
        context TEXT NOT NULL DEFAULT '{}', dry_run INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL, updated_at REAL NOT NULL, step_started_at REAL
    );
    CREATE TABLE actions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, incident_id INTEGER,
        run_id INTEGER, action TEXT NOT NULL, target TEXT, params TEXT NOT NULL DEFAULT '{}',
        state TEXT NOT NULL, result TEXT NOT NULL DEFAULT '{}', dry_run INTEGER NOT NULL DEFAULT 0,
        who TEXT NOT NULL, started_at REAL NOT NULL, done_at REAL
    );
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, who TEXT NOT NULL,
        what TEXT NOT NULL, why TEXT NOT NULL, incident_id INTEGER,
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE commands (
        id TEXT PRIMARY KEY, target_kind TEXT NOT NULL, target TEXT NOT NULL, kind TEXT NOT NULL,
        args TEXT NOT NULL, created_at REAL NOT NULL, delivered_at REAL, acked_at REAL,
        result TEXT, incident_id INTEGER
    );
    CREATE INDEX commands_pending ON commands(target_kind, target, acked_at);
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, role TEXT NOT NULL, node TEXT, job TEXT,
        created_at REAL NOT NULL, revoked_at REAL
    );
    """,
    # Most events belong to no incident; indexing their NULLs only cost every insert.
    """
    DROP INDEX events_incident;
    CREATE INDEX events_incident ON events(incident_id) WHERE incident_id IS NOT NULL;
    """,
    # By kind, then time: where events are looked up by kind (trigger counts, diagnosis) the
    # range is by kind and a time window. Keyed by node as well, every commit of a fleet's
    # batches wrote one leaf page per node of the index; by time, its new entries share a few
    # pages at the right end of each kind (half the cost of storing a healthy verdict).
    """
    DROP INDEX events_kind_node;
    CREATE INDEX events_kind_ts ON events(kind, ts);
    """,
    # Outside effects (drain, notify): recorded before they are made, settled after.
    """
    CREATE TABLE effects (
        id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,
        target TEXT NOT NULL, args TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, result TEXT NOT NULL DEFAULT '{}',
        incident_id INTEGER, created_at REAL NOT NULL, done_at REAL
    );
    CREATE INDEX effects_state ON effects(state);
    """,
]


# A WAL file that grew past this (a burst of writes) is cut back to it when the WAL restarts.
WAL_SIZE_LIMIT = 64 << 20


def wal_path(db: Path) -> Path:
    """Where SQLite keeps the write-ahead log of the database at `db`."""
    return db.with_name(db.name + "-wal")


# Built once: json.dumps with any argument builds a new encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


class SqliteStore:
    """The embedded store: every SQL statement the coordinator runs on SQLite is in this class."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("PRAGMA busy_timeout=5000")
        self._lock = threading.RLock()
        self._depth = 0
        self._checkpointer: threading.Thread | None = None
        self._stop = threading.Event()
        self._catch_up = threading.Event()  # a background checkpoint pass has finished
        self.migrate()

    def start_background(self) -> None:
        self.start_checkpointer()

    def start_checkpointer(self, every_s: float = 1.0) -> None:
        """Move the WAL into the database from a thread of its own, and keep the WAL bounded.

        SQLite's automatic checkpoint runs inside a committing transaction and, with
        synchronous=FULL, fsyncs the whole database there: a stall of every acknowledgement
        queued behind it. A PASSIVE checkpoint on another connection never blocks the writer.

        But the writer starts the WAL over from its first frame only when, as it begins a
        transaction, every frame has been copied back; under a steady stream of commits the
        background checkpoint never catches up with the frames committed while it ran, and
        the WAL grows without end (~11 MB/s at 2,048 nodes a second). So after each
        background pass the writer copies that short remainder itself, before its next
        transaction (`_catch_up_wal`): a few milliseconds, once a pass, and the WAL restarts.
        """
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self.conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")

        def loop() -> None:
            conn = sqlite3.connect(self.path, isolation_level=None)
            try:
                while not self._stop.wait(every_s):
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self._catch_up.set()
            finally:
                conn.close()

        self._checkpointer = threading.Thread(target=loop, name="sentinel-wal", daemon=True)
        self._checkpointer.start()

    def close(self) -> None:
        self._stop.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
        self.conn.close()

    def file_sizes(self) -> dict[str, int]:
        """Bytes on disk: the database, and the WAL (which checkpoints keep bounded)."""
        sizes = {}
        for name, path in (("database", self.path), ("wal", wal_path(self.path))):
            try:
                sizes[name] = path.stat().st_size
            except FileNotFoundError:
                sizes[name] = 0
        return sizes

    # --- schema ------------------------------------------------------------------------------

    def schema_version(self) -> int:
        self.conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = self.conn.execute("SELECT version FROM schema_version").fetchone()
        return 0 if row is None else int(row[0])

    def migrate(self) -> int:
        with self.tx():
            version = self.schema_version()
            if version > len(MIGRATIONS):
                raise RuntimeError(
                    f"{self.path}: schema version {version} is newer than this build "
                    f"({len(MIGRATIONS)}); upgrade Sentinel"
                )
            for script in MIGRATIONS[version:]:
                for statement in script.split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
            self.conn.execute("DELETE FROM schema_version")
            self.conn.execute("INSERT INTO schema_version VALUES (?)", (len(MIGRATIONS),))
        return len(MIGRATIONS)

    # --- transactions ------------------------------------------------------------------------

    @contextmanager
    def tx(self) -> Iterator[None]:
        """A transaction (nested calls become savepoints): all of it commits, or none of it."""
        with self._lock:
            name = f"sp{self._depth}"
            if self._depth == 0:
                self._catch_up_wal()
                self.conn.execute("BEGIN IMMEDIATE")
            else:
                self.conn.execute(f"SAVEPOINT {name}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    self.conn.execute("ROLLBACK")
                else:
                    self.conn.execute(f"ROLLBACK TO {name}")
                    self.conn.execute(f"RELEASE {name}")
                raise
            self._depth -= 1
            if self._depth == 0:
                self.conn.execute("COMMIT")
            else:
                self.conn.execute(f"RELEASE {name}")

    def _catch_up_wal(self) -> None:
        """Copy back what was committed during the last background checkpoint pass, so that
        the transaction about to begin writes the WAL from its start again."""
        if self._catch_up.is_set():
            self._catch_up.clear()
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    # --- helpers -------------------------------------------------------------------------------

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self.conn.execute(sql, tuple(params)).fetchall()

    def _first(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            return self.conn.execute(sql, tuple(params)).fetchone()  # type: ignore[no-any-return]

    def _run(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self.conn.execute(sql, tuple(params))

    def _count(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self._first(sql, params)
        return int(row[0]) if row is not None and row[0] is not None else 0

    # Ad-hoc reads for tests and operators inspecting a store file; the coordinator itself
    # uses only the typed methods below.
    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return [_plain(r) for r in self._all(sql, params)]

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> dict[str, Any] | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        return self._run(sql, params)

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
        """Chunks of fixed sizes (256, then powers of two) keep the statements few and cached.
        A chunk all of whose rows went in (the rule: ids are unique) needs no lookup; only one
        with a replayed or repeated id asks which went in. `events` is a rowid table, so the
        rows one statement inserts take consecutive rowids ending at the last one inserted."""
        new: set[str] = set()
        rows = [  # a kind is a str enum: SQLite stores its value (no Python `.value` call)
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
            cur = self._run(
                _values_sql(_INSERT_EVENTS, "(?,?,?,?,?,?,?,?)", len(chunk)),
                tuple(chain.from_iterable(chunk)),
            )
            inserted, last = cur.rowcount, cur.lastrowid
            if inserted == len(chunk):
                new.update(row[0] for row in chunk)
            elif inserted > 0 and last is not None:
                new.update(
                    r[0]
                    for r in self._all(
                        "SELECT id FROM events WHERE rowid BETWEEN ? AND ?",
                        (last - inserted + 1, last),
                    )
                )
        return new

    def link_events(self, links: Iterable[tuple[str, int]]) -> None:
        with self._lock:
            self.conn.executemany(
                "UPDATE events SET incident_id=? WHERE id=?", [(i, e) for e, i in links]
            )

    def events_from(
        self, who: str, value: str, kinds: Sequence[str], since: float, limit: int
    ) -> list[StoredEvent]:
        column = {"node": "node", "job": "job"}[who]
        marks = ",".join("?" * len(kinds))
        return [
            _event(r)
            for r in self._all(
                f"SELECT {_EVENT_COLS} FROM events WHERE {column}=? AND kind IN ({marks})"
                " AND ts>=? LIMIT ?",
                (value, *kinds, since, limit),
            )
        ]

    def sdc_digests(
        self, job: str, check_id: str, since: float, after_step: int
    ) -> list[StoredEvent]:
        return [
            _event(r)
            for r in self._all(
                _SDC_ROWS + " AND job=? AND (json_extract(payload,'$.check_id')=?"
                " OR (received_at>=? AND json_extract(payload,'$.step')>?))",
                (job, check_id, since, after_step),
            )
        ]

    def sdc_digests_of_incident(self, incident_id: int) -> list[StoredEvent]:
        if not _key_ok(incident_id):
            return []
        return [_event(r) for r in self._all(_SDC_ROWS + " AND incident_id=?", (incident_id,))]

    def fr_analysis(self, job: str, check_id: str) -> StoredEvent | None:
        row = self._first(
            f"SELECT {_EVENT_COLS} FROM events WHERE kind='fr.analysis' AND job=?"
            " AND json_extract(payload,'$.check_id')=? ORDER BY ts DESC LIMIT 1",
            (job, check_id),
        )
        return None if row is None else _event(row)

    def prune_events(self, after: int, cutoff: float, chunk: int) -> PruneResult:
        """Rows go in rowid order, which is arrival order: walk from the cursor a chunk at a
        time, and stop at the first row that arrived after the cutoff."""
        rows = self._all(
            "SELECT rowid, received_at FROM events WHERE rowid > ? ORDER BY rowid LIMIT ?",
            (after, chunk),
        )
        upto = None
        for rowid, received in rows:
            if received >= cutoff:
                break
            upto = int(rowid)
        if upto is None:
            return PruneResult(0, after, False)
        with self.tx():
            cur = self._run(
                "DELETE FROM events WHERE rowid > ? AND rowid <= ? AND incident_id IS NULL",
                (after, upto),
            )
        backlog = len(rows) == chunk and upto == int(rows[-1][0])
        return PruneResult(max(cur.rowcount, 0), upto, backlog)

    # --- nodes -----------------------------------------------------------------------------

    def touch_nodes(self, seen: dict[str, str | None], now: float) -> None:
        # One statement per chunk, not one step per node: every statement the store thread runs
        # hands the GIL back and forth with the event loop, which costs most under load.
        rows = [(node, now, verdict) for node, verdict in seen.items()]
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
        row = self._first(f"SELECT {_NODE_COLS} FROM nodes WHERE name=?", (name,))
        return None if row is None else _node(row)

    def nodes(self, limit: int) -> list[NodeRow]:
        return [
            _node(r)
            for r in self._all(f"SELECT {_NODE_COLS} FROM nodes ORDER BY name LIMIT ?", (limit,))
        ]

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
        row = self._first(f"SELECT {_JOB_COLS} FROM jobs WHERE id=?", (job_id,))
        return None if row is None else _job(row)

    def jobs(self, limit: int, exclude_states: Iterable[str] = ()) -> list[JobRow]:
        out = [str(s) for s in exclude_states]
        return [
            _job(r)
            for r in self._all(
                f"SELECT {_JOB_COLS} FROM jobs WHERE state NOT IN ({','.join('?' * len(out))})"
                " ORDER BY id LIMIT ?",
                (*out, limit),
            )
        ]

    def silent_jobs(self, before: float, exclude_states: Iterable[str]) -> list[JobRow]:
        out = [str(s) for s in exclude_states]
        return [
            _job(r)
            for r in self._all(
                f"SELECT {_JOB_COLS} FROM jobs WHERE state NOT IN ({','.join('?' * len(out))})"
                " AND last_heartbeat < ?",
                (*out, before),
            )
        ]

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
        cur = self._run(
            "INSERT INTO incidents (key, fault, target, job, state, playbook, opened_at,"
            " updated_at, first_step, detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (key, fault, target, job, str(state), playbook, now, now, first_step, _detail(detail)),
        )
        return int(cur.lastrowid or 0)

    def incident(self, incident_id: int) -> IncidentRow | None:
        if not _key_ok(incident_id):
            return None
        row = self._first(f"SELECT {_INCIDENT_COLS} FROM incidents WHERE id=?", (incident_id,))
        return None if row is None else _incident(row)

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
        return [_incident(r) for r in rows]

    def incident_view(self, incident_id: int, events_limit: int) -> IncidentView | None:
        incident = self.incident(incident_id)
        if incident is None:
            return None
        events = [
            EventRow(*r)
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
            [_run(r) for r in runs],
            [_step(r) for r in steps],
            [_audit(r) for r in audit],
        )

    def active_incident(self, key: str, states: Iterable[str]) -> IncidentRow | None:
        states = [str(s) for s in states]
        row = self._first(
            f"SELECT {_INCIDENT_COLS} FROM incidents WHERE key=?"
            f" AND state IN ({','.join('?' * len(states))}) ORDER BY id DESC LIMIT 1",
            (key, *states),
        )
        return None if row is None else _incident(row)

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

    def detect_seconds(self) -> list[float]:
        return [
            float(r[0])
            for r in self._all(
                "SELECT i.opened_at - MIN(e.ts) FROM incidents i"
                " JOIN events e ON e.incident_id = i.id GROUP BY i.id"
            )
        ]

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
        cur = self._run(
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
        return int(cur.lastrowid or 0)

    def run(self, run_id: int) -> RunRow | None:
        if not _key_ok(run_id):
            return None
        row = self._first(f"SELECT {_RUN_COLS} FROM runs WHERE id=?", (run_id,))
        return None if row is None else _run(row)

    def runs(self, statuses: Iterable[str], incident_id: int | None = None) -> list[RunRow]:
        statuses = [str(s) for s in statuses]
        sql = f"SELECT {_RUN_COLS} FROM runs WHERE status IN ({','.join('?' * len(statuses))})"
        if incident_id is None:
            return [_run(r) for r in self._all(sql + " ORDER BY id", statuses)]
        return [
            _run(r)
            for r in self._all(sql + " AND incident_id=? ORDER BY id", (*statuses, incident_id))
        ]

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
        row = self._first(f"SELECT {_STEP_COLS} FROM actions WHERE key=?", (key,))
        return None if row is None else _step(row)

    def steps(self, limit: int) -> list[StepRow]:
        return [
            _step(r)
            for r in self._all(f"SELECT {_STEP_COLS} FROM actions ORDER BY id LIMIT ?", (limit,))
        ]

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
        row = self._first(f"SELECT {_EFFECT_COLS} FROM effects WHERE key=?", (key,))
        return None if row is None else _effect(row)

    def effects(self, states: Iterable[str]) -> list[EffectRow]:
        states = [str(s) for s in states]
        return [
            _effect(r)
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
        with self._lock:
            self.conn.executemany(
                "INSERT OR IGNORE INTO commands (id, target_kind, target, kind, args, created_at,"
                " incident_id) VALUES (?,?,?,?,?,?,?)",
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
        row = self._first(f"SELECT {_COMMAND_COLS} FROM commands WHERE id=?", (command_id,))
        return None if row is None else _command(row)

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
        return [_command(r) for r in rows]

    def ack_command(self, command_id: str, result: dict[str, Any], now: float) -> bool:
        cur = self._run(
            "UPDATE commands SET acked_at=?, result=? WHERE id=? AND acked_at IS NULL",
            (now, _dumps(result), command_id),
        )
        return cur.rowcount == 1

    def has_undelivered_commands(self) -> bool:
        return self._first("SELECT 1 FROM commands WHERE delivered_at IS NULL LIMIT 1") is not None

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
        return [
            _audit(r)
            for r in self._all(
                f"SELECT {_AUDIT_COLS} FROM audit ORDER BY id DESC LIMIT ?", (limit,)
            )
        ]

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
        row = self._first(
            f"SELECT {_TOKEN_COLS} FROM tokens WHERE id=? AND revoked_at IS NULL", (token_id,)
        )
        return None if row is None else TokenRow(*row)

    def tokens(self) -> list[TokenRow]:
        return [
            TokenRow(*r) for r in self._all(f"SELECT {_TOKEN_COLS} FROM tokens ORDER BY created_at")
        ]

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


Store = SqliteStore  # the embedded default; see interface.py for what any backend provides

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
    """An integer key SQLite can bind: larger ones name no row (and would overflow)."""
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
_SDC_ROWS = (
    f"SELECT {_EVENT_COLS} FROM events WHERE kind='rank.sdc'"
    " AND COALESCE(json_extract(payload,'$.check'),'matmul')='matmul'"
)


def _node(r: sqlite3.Row) -> NodeRow:
    return NodeRow(r[0], r[1], r[2], NodeState(r[3]), r[4], r[5])


def _job(r: sqlite3.Row) -> JobRow:
    return JobRow(r[0], JobState(r[1]), int(r[2]), r[3], JobStatusPayload.model_validate_json(r[4]))


def _incident(r: sqlite3.Row) -> IncidentRow:
    return IncidentRow(
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        IncidentState(r[5]),
        r[6],
        r[7],
        r[8],
        r[9],
        r[10],
        IncidentDetail.model_validate_json(r[11]),
    )


def _run(r: sqlite3.Row) -> RunRow:
    return RunRow(
        r[0],
        r[1],
        r[2],
        RunState(r[3]),
        int(r[4]),
        RunContext.model_validate_json(r[5]),
        bool(r[6]),
        r[7],
        r[8],
        r[9],
    )


def _step(r: sqlite3.Row) -> StepRow:
    return StepRow(
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5],
        json.loads(r[6]),
        StepState(r[7]),
        json.loads(r[8]),
        bool(r[9]),
        r[10],
        r[11],
        r[12],
    )


def _audit(r: sqlite3.Row) -> AuditRow:
    return AuditRow(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]))


def _command(r: sqlite3.Row) -> CommandRow:
    result = json.loads(r[8]) if r[8] else None
    return CommandRow(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], result, r[9])


def _effect(r: sqlite3.Row) -> EffectRow:
    return EffectRow(
        r[0],
        r[1],
        r[2],
        r[3],
        json.loads(r[4]),
        EffectState(r[5]),
        int(r[6]),
        json.loads(r[7]),
        r[8],
        r[9],
        r[10],
    )


def _event(r: sqlite3.Row) -> StoredEvent:
    return StoredEvent(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]))


def _detail(detail: IncidentDetail) -> str:
    return detail.model_dump_json(exclude_none=True)


_JSON_COLUMNS = frozenset({"payload", "status", "detail", "context", "params", "result", "args"})


def _plain(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    for key in _JSON_COLUMNS & out.keys():
        value = out[key]
        if isinstance(value, str) and value[:1] in ("{", "["):  # runs.status is plain text
            out[key] = json.loads(value)
    return out


_CHUNK = 256  # rows per INSERT statement at most (8 parameters each for events)
_INSERT_EVENTS = (
    "INSERT OR IGNORE INTO events (id, kind, node, rank, job, ts, payload, received_at) VALUES "
)
# A node heard from for the first time starts in the column's default state (active).
_UPSERT_NODES = "INSERT INTO nodes (name, last_seen, verdict) VALUES "
_UPSERT_NODES_TAIL = (
    " ON CONFLICT(name) DO UPDATE SET last_seen=excluded.last_seen,"
    " verdict=COALESCE(excluded.verdict, nodes.verdict)"
)
_T = TypeVar("_T")


def _chunks(rows: list[_T]) -> Iterator[list[_T]]:
    """`rows` in chunks of fixed sizes (256, then powers of two): few statements, each of a
    size seen before, so SQLite's statement cache keeps them prepared."""
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
