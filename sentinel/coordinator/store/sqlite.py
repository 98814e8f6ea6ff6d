"""The embedded store backend: SQLite in WAL mode.

One connection, used by one thread at a time (the coordinator funnels every call through a
single-thread executor). Commits use `synchronous=FULL`, so a committed transaction survives
kill -9 and power loss; the API acknowledges an event only after its transaction committed.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, bindparam, create_engine, event, func, select
from sqlalchemy.dialects import sqlite

from sentinel.coordinator.store.migrate import migrate
from sentinel.coordinator.store.schema import events
from sentinel.coordinator.store.sql import SqlStore

# A WAL file that grew past this (a burst of writes) is cut back to it when the WAL restarts.
WAL_SIZE_LIMIT = 64 << 20
_COLUMNS = ("id", "kind", "node", "rank", "job", "ts", "payload", "received_at")
_INSERT_EVENTS = (
    sqlite.insert(events)
    .values({c: bindparam(c) for c in _COLUMNS})
    .on_conflict_do_nothing(index_elements=["id"])
)
_LAST_SEQ = select(func.max(events.c.seq))


def wal_path(db: Path) -> Path:
    """Where SQLite keeps the write-ahead log of the database at `db`."""
    return db.with_name(db.name + "-wal")


class SqliteStore(SqlStore):
    """The embedded store: one file, one writer (the coordinator's store thread)."""

    BEGIN = "BEGIN IMMEDIATE"
    _insert = staticmethod(sqlite.insert)

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            f"sqlite:///{path}",
            isolation_level="AUTOCOMMIT",  # transactions are `tx()`'s: BEGIN IMMEDIATE
            connect_args={"check_same_thread": False},
        )
        event.listen(engine, "connect", _pragmas)
        super().__init__(engine)
        self._checkpointer: threading.Thread | None = None
        self._stop = threading.Event()
        self._catch_up = threading.Event()  # a background checkpoint pass has finished
        self.revision = migrate(self)

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
        transaction (`_before_begin`): a few milliseconds, once a pass, and the WAL restarts.
        """
        self._sql("PRAGMA wal_autocheckpoint=0")
        self._sql(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")

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
        super().close()

    def file_sizes(self) -> dict[str, int]:
        """Bytes on disk: the database, and the WAL (which checkpoints keep bounded)."""
        sizes = {}
        for name, path in (("database", self.path), ("wal", wal_path(self.path))):
            try:
                sizes[name] = path.stat().st_size
            except FileNotFoundError:
                sizes[name] = 0
        return sizes

    def _before_begin(self, conn: Connection) -> None:
        """Copy back what was committed during the last background checkpoint pass, so that
        the transaction about to begin writes the WAL from its start again."""
        if self._catch_up.is_set():
            self._catch_up.clear()
            conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _insert_new(self, rows: list[dict[str, Any]]) -> set[str]:
        """All rows in one `executemany` (a loop in C). When some id was stored before, the
        rows that went in are those past the arrival cursor as it stood: one writer holds the
        database, and its rows take the next `seq`s."""
        before = self._many(_LAST_SEQ, {})[0][0]
        inserted = self._many(_INSERT_EVENTS, rows)
        if inserted == len(rows):
            return {row["id"] for row in rows}
        if inserted <= 0:
            return set()
        found = select(events.c.id).where(events.c.seq > (before or 0))
        return {r[0] for r in self._x(found)}


def _pragmas(dbapi: sqlite3.Connection, _record: Any) -> None:
    dbapi.execute("PRAGMA journal_mode=WAL")
    dbapi.execute("PRAGMA synchronous=FULL")
    dbapi.execute("PRAGMA busy_timeout=5000")
