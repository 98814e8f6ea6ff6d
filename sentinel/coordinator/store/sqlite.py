"""The embedded store backend: SQLite in WAL mode, schema versioned with migrations.

It implements `interface.StateStore`; every SQL statement the coordinator runs on SQLite is
here, and typed rows (`rows.py`) are what leaves.

One connection, used by one thread at a time (the coordinator funnels every call through a
single-thread executor). Commits use `synchronous=FULL`, so a committed transaction survives
kill -9 and power loss; the API acknowledges an event only after its transaction committed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any

from sentinel.coordinator.store.base import values_sql
from sentinel.coordinator.store.sql import SqlStore

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
    # Flight-recorder dumps carried from the nodes: in the store, so that every coordinator
    # sharing it serves a dump whichever one the agent uploaded it to.
    """
    CREATE TABLE fr_dumps (
        check_id TEXT NOT NULL, node TEXT NOT NULL, name TEXT NOT NULL, data BLOB NOT NULL,
        stored_at REAL NOT NULL, PRIMARY KEY (check_id, node, name)
    );
    """,
    # A repair's stages, timed once its job's new gang reports its launch and first step.
    """
    CREATE TABLE repair_stages (
        run_id INTEGER PRIMARY KEY, incident_id INTEGER NOT NULL, playbook TEXT NOT NULL,
        detected_at REAL NOT NULL, decided_at REAL NOT NULL, drained_at REAL,
        restart_at REAL NOT NULL, relaunched_at REAL NOT NULL, rendezvoused_at REAL NOT NULL,
        checkpoint_loaded_at REAL NOT NULL, first_step_at REAL NOT NULL,
        resume_step INTEGER NOT NULL
    );
    CREATE INDEX repair_stages_incident ON repair_stages(incident_id);
    """,
]


# A WAL file that grew past this (a burst of writes) is cut back to it when the WAL restarts.
WAL_SIZE_LIMIT = 64 << 20


def wal_path(db: Path) -> Path:
    """Where SQLite keeps the write-ahead log of the database at `db`."""
    return db.with_name(db.name + "-wal")


class SqliteStore(SqlStore):
    """The embedded store: one file, one writer (the coordinator's store thread)."""

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

    def _runmany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._lock:
            self.conn.executemany(sql, rows)

    def _insert_id(self, sql: str, params: Sequence[Any]) -> int:
        return int(self._run(sql, params).lastrowid or 0)

    def _json_text(self, column: str, key: str) -> str:
        return f"json_extract({column},'$.{key}')"

    def _json_number(self, column: str, key: str) -> str:
        return f"json_extract({column},'$.{key}')"

    def _insert_event_chunk(self, chunk: list[tuple[Any, ...]]) -> Iterable[str]:
        """A chunk all of whose rows went in (the rule: ids are unique) needs no lookup; only
        one with a replayed or repeated id asks which went in. `events` is a rowid table, so
        the rows one statement inserts take consecutive rowids ending at the last inserted."""
        cur = self._run(
            values_sql(_INSERT_EVENTS, "(?,?,?,?,?,?,?,?)", len(chunk)),
            tuple(chain.from_iterable(chunk)),
        )
        inserted, last = cur.rowcount, cur.lastrowid
        if inserted == len(chunk):
            return [row[0] for row in chunk]
        if inserted > 0 and last is not None:
            return [
                r[0]
                for r in self._all(
                    "SELECT id FROM events WHERE rowid BETWEEN ? AND ?",
                    (last - inserted + 1, last),
                )
            ]
        return []

    def _dicts(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        return [dict(r) for r in self._all(sql, params)]


Store = SqliteStore  # the embedded default


_INSERT_EVENTS = (
    "INSERT OR IGNORE INTO events (id, kind, node, rank, job, ts, payload, received_at) VALUES "
)
