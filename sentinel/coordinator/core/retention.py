"""Event retention: events no incident holds are deleted once older than the retention.

A fleet's heartbeats and verdicts are most of what the coordinator stores (2,048 nodes with the
agent's defaults: ~12 million rows a day), and without a bound the store grows for as long as
the run lasts. Events linked to an incident stay as its record, with the incident itself.

Rows go in arrival order (the store's event cursor: SQLite's rowid, a PostgreSQL sequence): the pruner walks the table from its oldest row a
chunk at a time, and stops at the first row that arrived after the cutoff. A short chunk per
engine tick keeps every transaction small, so ingest commits never wait long behind one.
"""

from __future__ import annotations

from collections.abc import Callable

from sentinel.coordinator.core.playbooks import Playbook
from sentinel.coordinator.core.store import StateStore

DEFAULT_CHUNK = 1000  # rows examined per pass: ~10 ms of the store thread on a slow core
IDLE_CHECK_S = 10.0  # with no backlog, how often to look again


def windows_past_retention(playbooks: list[Playbook], retention_s: float) -> list[str]:
    """Trigger windows that count events the pruner would already have deleted."""
    return [
        f"{book.name}: trigger window {clause.window_s:g} s is longer than "
        f"coordinator.event_retention_s ({retention_s:g} s)"
        for book in playbooks
        for clause in book.trigger
        if clause.window_s > retention_s
    ]


class EventPruner:
    def __init__(
        self,
        store: StateStore,
        retention_s: float,
        chunk: int = DEFAULT_CHUNK,
        on_prune: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.store = store
        self.retention_s = retention_s
        self.chunk = chunk
        self.on_prune = on_prune
        self._after = 0  # arrival cursor: every event up to it is pruned or held by an incident
        self._next_at = 0.0

    def maybe_prune(self, now: float) -> int:
        """One pass when one is due: straight away while a backlog lasts, else every
        `IDLE_CHECK_S`. The number of events deleted."""
        if now < self._next_at:
            return 0
        deleted, backlog = self.prune_once(now - self.retention_s)
        if not backlog:  # the flight-recorder dumps go with the events, once caught up
            self.store.prune_fr_dumps(now - self.retention_s)
        self._next_at = now if backlog else now + IDLE_CHECK_S
        return deleted

    def prune_once(self, cutoff: float) -> tuple[int, bool]:
        """Delete the unheld events among the next chunk that arrived before `cutoff`;
        (deleted, whether older events may remain)."""
        done = self.store.prune_events(self._after, cutoff, self.chunk)
        self._after = done.after
        if done.deleted:
            self.on_prune(done.deleted)
        return done.deleted, done.backlog
