"""A bounded on-disk queue of events awaiting delivery to the coordinator.

Every event is written here before any delivery attempt, so an agent restart (or kill -9) loses
nothing: delivery resumes from what is on disk. Past `max_events` the oldest are dropped and
counted — the only way an event is ever lost, and a visible one.
SQLite in WAL mode: one file, atomic appends and acknowledgements, no partial records.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sentinel.protocol import Event, decode_event, encode

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('dropped', 0);
"""


class Spool:
    def __init__(self, directory: Path, max_events: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.max_events = max_events
        self._db = sqlite3.connect(directory / "outbox.sqlite", check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL survives a process crash (kill -9); only a power cut may lose the last commits.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()  # collection thread and event loop both append

    def append(self, events: list[Event]) -> int:
        """Persist events; returns how many old ones had to be dropped to stay within bounds."""
        if not events:
            return 0
        with self._lock, self._db:
            self._db.executemany(
                "INSERT INTO outbox (body) VALUES (?)", [(encode(e),) for e in events]
            )
            excess = self._count() - self.max_events
            if excess > 0:
                self._db.execute(
                    "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?)",
                    (excess,),
                )
                self._db.execute(
                    "UPDATE counters SET value = value + ? WHERE name = 'dropped'", (excess,)
                )
            return max(excess, 0)

    def peek(self, limit: int) -> tuple[int, list[Event]]:
        """The oldest events, and the sequence number to acknowledge them up to."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, body FROM outbox ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        if not rows:
            return 0, []
        return rows[-1][0], [decode_event(body) for _, body in rows]

    def ack(self, upto_seq: int) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM outbox WHERE seq <= ?", (upto_seq,))

    def __len__(self) -> int:
        with self._lock:
            return self._count()

    @property
    def dropped(self) -> int:
        with self._lock:
            return int(
                self._db.execute("SELECT value FROM counters WHERE name='dropped'").fetchone()[0]
            )

    def _count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
