"""The shared store backend: PostgreSQL, which several coordinator replicas use at once.

It runs the statements the repositories build through SQLAlchemy on psycopg 3, and adds what
a shared database needs:

- migrations taken under an advisory lock, so replicas starting together migrate once;
- `lock_key`: a transaction-scoped advisory lock, so two replicas ingesting the same fault open
  one incident;
- fencing: the leader's engine writes under `fenced(epoch)`, which sets the session's
  `sentinel.epoch`; a trigger on every table the engine writes refuses the statement when that
  epoch is no longer the one in the `leadership` row (`lease.py` moves it). A deposed leader's
  late write is refused by the database, not by the deposed leader's good manners;
- a lost connection raises `StoreUnavailable` (the API answers 503) and the next call connects
  again. Nothing the caller was told is committed was not.

A batch of events, and the nodes it saw, each travel as one statement whatever their number:
each column an array, unnested by the server (`_INSERT_EVENTS`, `_TOUCH`), one round trip and
one plan the server keeps prepared. The arrays travel in PostgreSQL's binary format: in the
text format the driver quotes and escapes every element (an event's JSON payload is mostly
quotes) in Python, which measured 14 µs a row against 3 on the store thread.

The password never travels in the URL: libpq reads it from `PGPASSFILE` / `PGPASSWORD`, or
`password_file` names a file holding it. Errors are reported without the connection string.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.array import ListBinaryDumper
from sqlalchemy import (
    Connection,
    Double,
    Integer,
    Text,
    bindparam,
    create_engine,
    event,
    exc,
    func,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url

from sentinel.coordinator.core.store import Fenced, StoreUnavailable
from sentinel.coordinator.store.fleet import touch_statement
from sentinel.coordinator.store.migrate import migrate
from sentinel.coordinator.store.schema import FENCE_SQLSTATE, events
from sentinel.coordinator.store.sql import SqlStore

# A session left idle inside a transaction this long (a leader paused with SIGSTOP mid-write)
# is ended by the server, so it cannot hold the leadership row against its successor.
IDLE_IN_TX_MS = 3000
_COLUMNS = {
    "id": Text,
    "kind": Text,
    "node": Text,
    "rank": Integer,
    "job": Text,
    "ts": Double,
    "payload": Text,
    "received_at": Double,
}
_ROWS = (
    func.unnest(*[bindparam(c, type_=postgresql.ARRAY(t)) for c, t in _COLUMNS.items()])
    .table_valued(*_COLUMNS)
    .render_derived()
)
_SEEN = (
    func.unnest(
        bindparam("name", type_=postgresql.ARRAY(Text)),
        bindparam("verdict", type_=postgresql.ARRAY(Text)),
    )
    .table_valued("name", "verdict")
    .render_derived()
)
_TOUCH = touch_statement(
    postgresql.insert, select(_SEEN.c.name, bindparam("now", type_=Double), _SEEN.c.verdict)
)
_INSERT_EVENTS = (
    postgresql.insert(events)
    .from_select(list(_COLUMNS), select(*[_ROWS.c[c] for c in _COLUMNS]))
    .on_conflict_do_nothing(index_elements=["id"])
    .returning(events.c.id)
)


class PostgresStore(SqlStore):
    """One replica's connection to the shared store, used by its store thread."""

    _insert = staticmethod(postgresql.insert)

    def __init__(
        self, url: str, password_file: Path | None = None, connect_timeout_s: float = 5.0
    ) -> None:
        self.url = url
        self._connect_args: dict[str, Any] = {
            "connect_timeout": max(1, round(connect_timeout_s)),
            "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TX_MS}",
            "application_name": "sentinel-coordinator",
        }
        if password_file is not None:
            self._connect_args["password"] = _read_password(password_file)
        engine = create_engine(
            make_url(url).set(drivername="postgresql+psycopg"),
            isolation_level="AUTOCOMMIT",  # transactions are `tx()`'s: BEGIN ... COMMIT
            connect_args=self._connect_args,
            pool_pre_ping=False,
        )
        event.listen(engine, "connect", _binary_arrays)
        super().__init__(engine)
        self._epoch: int | None = None
        self.revision = migrate(self)

    def connect(self) -> psycopg.Connection[Any]:
        """A driver connection of this store's settings (the lease holds one of its own)."""
        try:
            return psycopg.connect(self.url, autocommit=True, **self._connect_args)
        except psycopg.Error as e:
            raise StoreUnavailable(f"PostgreSQL unreachable: {_reason(e)}") from None

    def _connected(self, conn: Connection) -> None:
        if self._epoch is not None:  # a leader's session carries its epoch again
            self._set_epoch(conn, self._epoch)

    def _failure(self, orig: BaseException | None) -> Exception | None:
        if not isinstance(orig, psycopg.Error):
            return None
        if orig.sqlstate == FENCE_SQLSTATE:
            return Fenced(_reason(orig))
        if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
            lost = self._conn is not None
            if self._conn is not None:
                self._conn.invalidate()
                self._conn = None  # broken: the next call outside a transaction connects again
            how = "connection lost" if lost else "unreachable"
            return StoreUnavailable(f"PostgreSQL {how}: {_reason(orig)}")
        return None

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
                if self._conn is not None:
                    try:
                        self._set_epoch(self._conn, None)
                    except exc.DBAPIError:
                        self._conn.invalidate()
                        self._conn = None

    @staticmethod
    def _set_epoch(conn: Connection, epoch: int | None) -> None:
        conn.execute(
            select(func.set_config("sentinel.epoch", "" if epoch is None else str(epoch), False))
        )

    # --- what PostgreSQL does its own way ------------------------------------------------------

    def file_sizes(self) -> dict[str, int]:
        """The database's size on the server's disk (its WAL is the server's to manage)."""
        return {"database": self._count(select(func.pg_database_size(func.current_database())))}

    def lock_key(self, key: str) -> None:
        self._x(select(func.pg_advisory_xact_lock(func.hashtext(key))))

    def _touch(self, seen: list[tuple[str, str | None]], now: float) -> None:
        """Every node seen in one statement: names and verdicts as arrays."""
        names, verdicts = [n for n, _ in seen], [v for _, v in seen]
        self._many(_TOUCH, {"name": names, "verdict": verdicts, "now": now})

    def _insert_new(self, rows: list[dict[str, Any]]) -> set[str]:
        columns = {c: [row[c] for row in rows] for c in _COLUMNS}
        return {r[0] for r in self._many(_INSERT_EVENTS, columns)}


def _binary_arrays(conn: psycopg.Connection[Any], _record: object) -> None:
    """Lists (the arrays the hot path's statements unnest) are sent in the binary format."""
    conn.adapters.register_dumper(list, ListBinaryDumper)


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
