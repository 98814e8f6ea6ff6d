"""The shared store backend: PostgreSQL, which several coordinator replicas use at once.

It implements the statements of `sql.SqlStore` through psycopg 3 (`?` placeholders become the
driver's `%s`), and adds what a shared database needs:

- migrations taken under an advisory lock, so replicas starting together migrate once;
- `lock_key`: a transaction-scoped advisory lock, so two replicas ingesting the same fault open
  one incident;
- fencing: the leader's engine writes under `fenced(epoch)`, which sets the session's
  `sentinel.epoch`; a trigger on every table the engine writes refuses the statement when that
  epoch is no longer the one in the `leadership` row (`lease.py` moves it). A deposed leader's
  late write is refused by the database, not by the deposed leader's good manners;
- a lost connection raises `StoreUnavailable` (the API answers 503) and the next call connects
  again. Nothing the caller was told is committed was not.

The password never travels in the URL: libpq reads it from `PGPASSFILE` / `PGPASSWORD`, or
`password_file` names a file holding it. Errors are reported without the connection string.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from sentinel.coordinator.core.store import Fenced, StoreUnavailable
from sentinel.coordinator.store.base import values_sql
from sentinel.coordinator.store.sql import SqlStore

FENCE_SQLSTATE = "SN001"  # raised by sentinel_fence(): a deposed leader's write
MIGRATION_LOCK = 7305114  # advisory lock id: one replica migrates at a time
# A session left idle inside a transaction this long (a leader paused with SIGSTOP mid-write)
# is ended by the server, so it cannot hold the leadership row against its successor.
IDLE_IN_TX_MS = 3000

# Tables the engine writes; each gets the fence trigger.
FENCED_TABLES = ("incidents", "runs", "actions", "nodes", "jobs", "effects", "commands", "audit")

# Each entry moves the schema from version i to i+1. Append; never edit a shipped entry.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE events (
        seq BIGSERIAL UNIQUE, id TEXT PRIMARY KEY, kind TEXT NOT NULL, node TEXT, rank INTEGER,
        job TEXT, ts DOUBLE PRECISION NOT NULL, payload TEXT NOT NULL,
        received_at DOUBLE PRECISION NOT NULL, incident_id BIGINT
    );
    CREATE INDEX events_incident ON events(incident_id) WHERE incident_id IS NOT NULL;
    CREATE INDEX events_kind_ts ON events(kind, ts);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY, last_seen DOUBLE PRECISION, verdict TEXT,
        state TEXT NOT NULL DEFAULT 'active', state_changed_at DOUBLE PRECISION, reason TEXT
    );
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY, state TEXT NOT NULL, generation INTEGER NOT NULL DEFAULT 0,
        last_heartbeat DOUBLE PRECISION, status TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE incidents (
        id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, fault TEXT NOT NULL, target TEXT NOT NULL,
        job TEXT, state TEXT NOT NULL, playbook TEXT, opened_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL, first_step BIGINT, acknowledged_by TEXT,
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX incidents_key ON incidents(key, state);
    CREATE TABLE runs (
        id BIGSERIAL PRIMARY KEY, incident_id BIGINT NOT NULL, playbook TEXT NOT NULL,
        status TEXT NOT NULL, step_index INTEGER NOT NULL DEFAULT 0,
        context TEXT NOT NULL DEFAULT '{}', dry_run INTEGER NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        step_started_at DOUBLE PRECISION
    );
    CREATE TABLE actions (
        id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL UNIQUE, incident_id BIGINT, run_id BIGINT,
        action TEXT NOT NULL, target TEXT, params TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL,
        result TEXT NOT NULL DEFAULT '{}', dry_run INTEGER NOT NULL DEFAULT 0, who TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL, done_at DOUBLE PRECISION
    );
    CREATE TABLE audit (
        id BIGSERIAL PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, who TEXT NOT NULL,
        what TEXT NOT NULL, why TEXT NOT NULL, incident_id BIGINT,
        detail TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE commands (
        id TEXT PRIMARY KEY, target_kind TEXT NOT NULL, target TEXT NOT NULL, kind TEXT NOT NULL,
        args TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, delivered_at DOUBLE PRECISION,
        acked_at DOUBLE PRECISION, result TEXT, incident_id BIGINT
    );
    CREATE INDEX commands_pending ON commands(target_kind, target, acked_at);
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, role TEXT NOT NULL, node TEXT, job TEXT,
        created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION
    );
    CREATE TABLE effects (
        id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,
        target TEXT NOT NULL, args TEXT NOT NULL DEFAULT '{}', state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, result TEXT NOT NULL DEFAULT '{}',
        incident_id BIGINT, created_at DOUBLE PRECISION NOT NULL, done_at DOUBLE PRECISION
    );
    CREATE INDEX effects_state ON effects(state);
    CREATE TABLE leadership (
        name TEXT PRIMARY KEY, holder TEXT, epoch BIGINT NOT NULL DEFAULT 0,
        expires_at DOUBLE PRECISION NOT NULL DEFAULT 0
    );
    INSERT INTO leadership (name) VALUES ('engine');
    CREATE FUNCTION sentinel_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$
    DECLARE
        claimed TEXT := current_setting('sentinel.epoch', true);
    BEGIN
        IF claimed IS NULL OR claimed = '' THEN
            RETURN NULL;  -- not the engine's write: any replica ingests
        END IF;
        -- FOR SHARE: a successor's takeover waits for this transaction instead of racing it
        PERFORM 1 FROM leadership WHERE name = 'engine' AND epoch = claimed::BIGINT FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'fenced: epoch % is no longer the leader''s', claimed
                USING ERRCODE = 'SN001';
        END IF;
        RETURN NULL;
    END
    $fence$;
    """
    + "".join(
        f"CREATE TRIGGER {t}_fence BEFORE INSERT OR UPDATE OR DELETE ON {t}"
        " FOR EACH STATEMENT EXECUTE FUNCTION sentinel_fence();\n"
        for t in FENCED_TABLES
    ),
    # Flight-recorder dumps carried from the nodes: every replica serves every upload.
    """
    CREATE TABLE fr_dumps (
        check_id TEXT NOT NULL, node TEXT NOT NULL, name TEXT NOT NULL, data BYTEA NOT NULL,
        stored_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (check_id, node, name)
    );
    """,
    # A repair's stages, timed once its job's new gang reports its launch and first step.
    """
    CREATE TABLE repair_stages (
        run_id BIGINT PRIMARY KEY, incident_id BIGINT NOT NULL, playbook TEXT NOT NULL,
        detected_at DOUBLE PRECISION NOT NULL, decided_at DOUBLE PRECISION NOT NULL,
        drained_at DOUBLE PRECISION, restart_at DOUBLE PRECISION NOT NULL,
        relaunched_at DOUBLE PRECISION NOT NULL, rendezvoused_at DOUBLE PRECISION NOT NULL,
        checkpoint_loaded_at DOUBLE PRECISION NOT NULL, first_step_at DOUBLE PRECISION NOT NULL,
        resume_step BIGINT NOT NULL
    );
    CREATE INDEX repair_stages_incident ON repair_stages(incident_id);
    """,
]


@functools.cache
def _pg(statement: str) -> str:
    """The shared SQL's `?` placeholders in psycopg's style."""
    return statement.replace("%", "%%").replace("?", "%s")


class PostgresStore(SqlStore):
    """One replica's connection to the shared store, used by its store thread."""

    EVENT_CURSOR = "seq"

    def __init__(
        self, url: str, password_file: Path | None = None, connect_timeout_s: float = 5.0
    ) -> None:
        self.url = url
        self._connect_args: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(connect_timeout_s)),
            "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TX_MS}",
            "application_name": "sentinel-coordinator",
        }
        if password_file is not None:
            self._connect_args["password"] = _read_password(password_file)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.RLock()
        self._depth = 0
        self._epoch: int | None = None
        self.migrate()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # --- connection --------------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection of this store's settings (the lease holds one of its own)."""
        try:
            return psycopg.connect(self.url, **self._connect_args)
        except psycopg.Error as e:
            raise StoreUnavailable(f"PostgreSQL unreachable: {_reason(e)}") from None

    def _connection(self) -> psycopg.Connection[Any]:
        """The session, connected again if it was lost, except inside a transaction: what
        the lost session held died with it, and statements on a new one would commit on
        their own, half a transaction (a batch acknowledged, part of it never stored)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._depth > 0:
            raise StoreUnavailable(
                "PostgreSQL connection lost in a transaction: none of it committed"
            )
        self._conn = conn = self.connect()
        if self._epoch is not None:  # a leader's session carries its epoch again
            self._set_epoch(conn, self._epoch)
        return conn

    @contextmanager
    def _driver(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection, with the driver's errors turned into the store's."""
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except psycopg.Error as e:
                if e.sqlstate == FENCE_SQLSTATE:
                    raise Fenced(_reason(e)) from None
                if isinstance(e, psycopg.OperationalError | psycopg.InterfaceError):
                    conn.close()  # broken: the next call connects again
                    raise StoreUnavailable(f"PostgreSQL connection lost: {_reason(e)}") from None
                raise

    # --- fencing -----------------------------------------------------------------------------

    @contextmanager
    def fenced(self, epoch: int) -> Iterator[None]:
        """Every write inside carries `epoch`; the database refuses it once another replica
        holds a newer one (`Fenced`)."""
        with self._lock:
            self._epoch = epoch
            try:
                with self._driver() as conn:
                    self._set_epoch(conn, epoch)
                yield
            finally:
                self._epoch = None
                if self._conn is not None and not self._conn.closed:
                    try:
                        self._set_epoch(self._conn, None)
                    except psycopg.Error:
                        self._conn.close()

    @staticmethod
    def _set_epoch(conn: psycopg.Connection[Any], epoch: int | None) -> None:
        value = "" if epoch is None else str(epoch)
        conn.execute("SELECT set_config('sentinel.epoch', %s, false)", (value,))

    # --- schema ------------------------------------------------------------------------------

    def migrate(self) -> int:
        with self.tx(), self._driver() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            version = 0 if row is None else int(row[0])
            if version > len(MIGRATIONS):
                raise RuntimeError(
                    f"schema version {version} is newer than this build ({len(MIGRATIONS)});"
                    " upgrade Sentinel"
                )
            for script in MIGRATIONS[version:]:
                conn.execute(script.encode())
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version VALUES (%s)", (len(MIGRATIONS),))
        return len(MIGRATIONS)

    # --- transactions ------------------------------------------------------------------------

    @contextmanager
    def tx(self) -> Iterator[None]:
        """A transaction (nested calls become savepoints): all of it commits, or none of it.
        Only the outermost BEGIN may open a new session; everything after it, the COMMIT
        included, runs on that session or fails (`_connection`)."""
        with self._lock:
            outer, name = self._depth == 0, f"sp{self._depth}"
            with self._driver() as conn:
                conn.execute("BEGIN" if outer else f"SAVEPOINT {name}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._undo(name, outer)
                raise
            else:
                with self._driver() as conn:
                    conn.execute("COMMIT" if outer else f"RELEASE {name}")
            finally:
                self._depth -= 1

    def _undo(self, savepoint: str, outer: bool) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            return  # the server rolled it back with the session
        try:
            if outer:
                conn.execute("ROLLBACK")
            else:
                conn.execute(f"ROLLBACK TO {savepoint}")
                conn.execute(f"RELEASE {savepoint}")
        except psycopg.Error:
            conn.close()

    def file_sizes(self) -> dict[str, int]:
        """The database's size on the server's disk (its WAL is the server's to manage)."""
        return {"database": self._count("SELECT pg_database_size(current_database())")}

    def lock_key(self, key: str) -> None:
        self._run("SELECT pg_advisory_xact_lock(hashtext(?))", (key,))

    # --- statements --------------------------------------------------------------------------

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._driver() as conn:
            return conn.execute(_pg(sql), tuple(params)).fetchall()

    def _first(self, sql: str, params: Sequence[Any] = ()) -> Any | None:
        with self._driver() as conn:
            return conn.execute(_pg(sql), tuple(params)).fetchone()

    def _run(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        with self._driver() as conn:
            return conn.execute(_pg(sql), tuple(params))

    def _runmany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        with self._driver() as conn:
            conn.cursor().executemany(_pg(sql), rows)

    def _dicts(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        with self._driver() as conn:
            cur = conn.execute(_pg(sql), tuple(params))
            names = [c.name for c in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def _insert_id(self, sql: str, params: Sequence[Any]) -> int:
        row = self._first(sql + " RETURNING id", params)
        assert row is not None
        return int(row[0])

    def _json_text(self, column: str, key: str) -> str:
        return f"({column}::json->>'{key}')"

    def _json_number(self, column: str, key: str) -> str:
        return f"({column}::json->>'{key}')::double precision"

    def _insert_event_chunk(self, chunk: list[tuple[Any, ...]]) -> Iterable[str]:
        statement = values_sql(_INSERT_EVENTS, "(?,?,?,?,?,?,?,?)", len(chunk), _RETURNING_NEW)
        return [r[0] for r in self._all(statement, [v for row in chunk for v in row])]

    # --- leadership (lease.py moves it; the fence trigger reads it) -----------------------

    def leadership(self) -> tuple[str | None, int, float]:
        """(holder, epoch, seconds the lease has left by the database's clock)."""
        row = self._first(
            "SELECT holder, epoch, expires_at - EXTRACT(EPOCH FROM clock_timestamp())"
            " FROM leadership WHERE name='engine'"
        )
        assert row is not None
        return row[0], int(row[1]), float(row[2])


def _read_password(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise ValueError(f"store_password_file {path}: {e.strerror}") from None


def _reason(error: psycopg.Error) -> str:
    """The server's or libpq's message, first line only: never the connection string."""
    primary = error.diag.message_primary
    if primary:
        return primary
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


_INSERT_EVENTS = "INSERT INTO events (id, kind, node, rank, job, ts, payload, received_at) VALUES "
_RETURNING_NEW = " ON CONFLICT (id) DO NOTHING RETURNING id"
