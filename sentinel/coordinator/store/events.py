"""Events: stored once by id, looked up by kind, node or job, pruned in arrival order."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic_core import to_json

from sentinel.coordinator.core.rows import (
    PruneResult,
    StoredEvent,
)
from sentinel.coordinator.store.base import EVENT_COLS, SqlBase, chunks, from_row, key_ok
from sentinel.protocol import Event


class EventsRepo(SqlBase):
    def _sdc_rows(self) -> str:
        return (
            f"SELECT {EVENT_COLS} FROM events WHERE kind='rank.sdc'"
            f" AND COALESCE({self._json_text('payload', 'check')},'matmul')='matmul'"
        )

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
        for chunk in chunks(rows):
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
            f"SELECT {EVENT_COLS} FROM events WHERE {column}=? AND kind IN ({marks})"
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
        if not key_ok(incident_id):
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
            f"SELECT {EVENT_COLS} FROM events WHERE kind=? AND {scope[0]}=?"
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
                f"SELECT {EVENT_COLS} FROM events WHERE kind='rank.stacks' AND job=?"
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

    def first_event_ts(self, incident_id: int) -> float | None:
        row = self._first("SELECT MIN(ts) FROM events WHERE incident_id=?", (incident_id,))
        return None if row is None or row[0] is None else float(row[0])
