"""Which replica runs the engine: a lease with an epoch in the shared store.

Every replica serves the API and ingests. One, the leader, runs the playbook engine, the outside
effects and housekeeping, under a lease it renews every third of `lease_ttl_s` on a connection
and thread of its own (a slow store call never costs it the lease). A follower tries to take the
lease as often; it gets it only once the lease has run out by the database's clock, and with it a
new epoch. The engine's writes carry the epoch (`PostgresStore.fenced`), so a deposed leader's
late write is refused by the database itself.

A replica stops acting as leader as soon as it cannot be sure it still is: when a renewal fails,
and when its own clock says the lease ran out since the last renewal it saw succeed (a process
paused by SIGSTOP wakes up believing nothing; it checks the time before every outside effect).

With SQLite there is one coordinator: `SoleLeadership` always leads, at epoch 1.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # psycopg is the postgresql extra's: imported only where it is used
    from sentinel.coordinator.store.postgres import PostgresStore

log = logging.getLogger("sentinel.coordinator.leadership")


class Leadership(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...

    @property
    def epoch(self) -> int | None:
        """The epoch this replica leads at, or None while it follows."""

    def leads(self) -> bool:
        """Whether this replica may act as leader right now (its lease has not run out)."""

    def deposed(self) -> None:
        """The store refused a write under our epoch: follow at once."""


class SoleLeadership:
    """One coordinator on its own store: always the leader."""

    epoch: int | None = 1

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def leads(self) -> bool:
        return True

    def deposed(self) -> None:  # nothing else can hold the store
        log.error("a write was refused as from a deposed leader, with no other replica")


def replica_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaseLeadership:
    """The lease in PostgreSQL, renewed (or claimed) by a thread of its own."""

    def __init__(self, store: PostgresStore, ttl_s: float, name: str | None = None) -> None:
        self.store, self.ttl_s = store, ttl_s
        self.name = name or replica_name()
        self._epoch: int | None = None
        self._valid_until = 0.0  # monotonic: the lease's end as last confirmed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None

    @property
    def epoch(self) -> int | None:
        return self._epoch if self.leads() else None

    def leads(self) -> bool:
        with self._lock:
            return self._epoch is not None and time.monotonic() < self._valid_until

    def deposed(self) -> None:
        with self._lock:
            if self._epoch is not None:
                log.warning("deposed: epoch %d is no longer the leader's", self._epoch)
            self._epoch = None

    def start(self) -> None:
        self.renew_once()
        self._thread = threading.Thread(target=self._loop, name="sentinel-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        epoch = self._epoch
        if epoch is not None and self._conn is not None:
            try:  # a clean stop hands over at once: the successor need not wait the lease out
                release_leadership(self._conn, self.name, epoch)
            except Exception:
                log.debug("releasing the lease failed; it runs out by itself", exc_info=True)
        self._epoch = None
        if self._conn is not None:
            self._conn.close()

    def renew_once(self) -> None:
        """Renew the lease we hold, or try to take it; follow on any doubt."""
        started = time.monotonic()
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self.store.connect()
            held = claim_leadership(self._conn, self.name, self._epoch, self.ttl_s)
        except Exception as e:  # the database is away (or refused): we cannot be sure
            if self._conn is not None:
                self._conn.close()
            if self._epoch is not None:
                log.warning("lease not renewed (%s); following", type(e).__name__)
            held = None
        with self._lock:
            if held is not None and held != self._epoch:
                log.warning("leading at epoch %d", held)
            elif held is None and self._epoch is not None:
                log.warning("lost the lease at epoch %d", self._epoch)
            self._epoch = held
            # Counted from before the request left: the database's lease runs at least this long.
            self._valid_until = started + self.ttl_s if held is not None else 0.0

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self.renew_once()


def claim_leadership(conn: Any, holder: str, epoch: int | None, ttl_s: float) -> int | None:
    """Renew the lease `holder` holds at `epoch`, or take it (a new epoch) when it has run out;
    the epoch held now, or None when another replica holds a live lease. The database's clock
    decides, so replicas' clocks need not agree."""
    now = "EXTRACT(EPOCH FROM clock_timestamp())"
    if epoch is not None:
        row = conn.execute(
            f"UPDATE leadership SET expires_at = {now} + %s"
            " WHERE name='engine' AND holder=%s AND epoch=%s RETURNING epoch",
            (ttl_s, holder, epoch),
        ).fetchone()
        return None if row is None else int(row[0])
    row = conn.execute(
        f"UPDATE leadership SET holder=%s, epoch=epoch+1, expires_at = {now} + %s"
        f" WHERE name='engine' AND expires_at < {now} RETURNING epoch",
        (holder, ttl_s),
    ).fetchone()
    return None if row is None else int(row[0])


def release_leadership(conn: Any, holder: str, epoch: int) -> None:
    """Give the lease up at once (a clean shutdown): a successor need not wait it out."""
    conn.execute(
        "UPDATE leadership SET expires_at = 0 WHERE name='engine' AND holder=%s AND epoch=%s",
        (holder, epoch),
    )
