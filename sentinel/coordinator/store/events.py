"""Events: stored once by id, looked up by kind, node or job, pruned in arrival order."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic_core import to_json
from sqlalchemy import Select, and_, bindparam, delete, func, or_, select, update

from sentinel.coordinator.core.rows import PruneResult, StoredEvent
from sentinel.coordinator.store.base import SqlBase, columns, json_field, key_ok
from sentinel.coordinator.store.schema import events
from sentinel.protocol import Event

_STORED = [events.c[n] for n in columns(StoredEvent)]
_LINK = (
    update(events)
    .where(events.c.id == bindparam("event"))
    .values(incident_id=bindparam("incident"))
)


class EventsRepo(SqlBase, ABC):
    def insert_events(self, batch: Sequence[Event], received_at: float) -> set[str]:
        """Store the events not stored yet (by id); the ids stored now."""
        rows = [  # a kind is a str enum: the driver stores its value (no Python `.value` call)
            {
                "id": ev.id,
                "kind": ev.kind,
                "node": ev.source.node,
                "rank": ev.source.rank,
                "job": ev.source.job,
                "ts": ev.ts,
                "payload": to_json(ev.payload).decode(),
                "received_at": received_at,
            }
            for ev in batch
        ]
        return self._insert_new(rows) if rows else set()

    @abstractmethod
    def _insert_new(self, rows: list[dict[str, Any]]) -> set[str]:
        """Insert these event rows, skipping ids stored already; the ids inserted. How the rows
        travel to the database is the backend's."""

    def link_events(self, links: Iterable[tuple[str, int]]) -> None:
        params = [{"event": e, "incident": i} for e, i in links]
        if params:
            self._x(_LINK, params)

    def events_from(
        self, who: str, value: str, kinds: Sequence[str], since: float, limit: int
    ) -> list[StoredEvent]:
        column = {"node": events.c.node, "job": events.c.job}[who]
        where = and_(column == value, events.c.kind.in_(kinds), events.c.ts >= since)
        return self._rows(StoredEvent, select(*_STORED).where(where).limit(limit))

    def sdc_digests(
        self, job: str, check_id: str, since: float, after_step: int
    ) -> list[StoredEvent]:
        later = and_(
            events.c.received_at >= since, json_field(events.c.payload, "step", True) > after_step
        )
        asked = or_(json_field(events.c.payload, "check_id") == check_id, later)
        return self._rows(StoredEvent, _sdc().where(events.c.job == job, asked))

    def sdc_digests_of_incident(self, incident_id: int) -> list[StoredEvent]:
        if not key_ok(incident_id):
            return []
        return self._rows(StoredEvent, _sdc().where(events.c.incident_id == incident_id))

    def silenced_ranks(self, incident_id: int) -> list[StoredEvent]:
        """The incident's hangs its agents saw from outside the rank (`observer` agent): ranks
        whose own watchdog could not run, stopped or holding the GIL."""
        if not key_ok(incident_id):
            return []
        seen = _answer("rank.hang", "observer", "agent")
        return self._rows(StoredEvent, seen.where(events.c.incident_id == incident_id))

    def fr_analysis(self, job: str, check_id: str) -> StoredEvent | None:
        """The job's latest analysis of the flight-recorder check `check_id`."""
        found = _answer("fr.analysis", "check_id", check_id).where(events.c.job == job)
        return self._row(StoredEvent, found.order_by(events.c.ts.desc()).limit(1))

    def node_verdicts(self, node: str, since: float) -> list[tuple[float, str]]:
        """(arrival time, verdict) of the node's own verdicts and heartbeats since `since`,
        oldest first: the coordinator's record of how healthy its agent said it was."""
        rows = self._x(
            select(events.c.received_at, json_field(events.c.payload, "verdict"))
            .where(events.c.kind.in_(("node.health", "agent.heartbeat")))
            .where(events.c.node == node, events.c.received_at >= since)
            .order_by(events.c.received_at, events.c.seq)
        )
        return [(float(r[0]), str(r[1])) for r in rows]

    def node_validation(self, node: str, request_id: str) -> StoredEvent | None:
        """The node's answer to the `node.validate` named `request_id`, if it came."""
        found = _answer("node.validation", "request_id", request_id).where(events.c.node == node)
        return self._row(StoredEvent, found.order_by(events.c.received_at).limit(1))

    def rank_fr_dumps(self, job: str, check_id: str) -> list[StoredEvent]:
        """The ranks' `rank.fr_dump` reports of one `fr.dump` check."""
        found = _answer("rank.fr_dump", "check_id", check_id).where(events.c.job == job)
        return self._rows(StoredEvent, found)

    def rank_stacks(self, job: str, request_id: str) -> list[StoredEvent]:
        """The ranks' `rank.stacks` answers to one stacks request, oldest first."""
        found = _answer("rank.stacks", "request_id", request_id).where(events.c.job == job)
        return self._rows(StoredEvent, found.order_by(events.c.received_at, events.c.id))

    def prune_events(self, after: int, cutoff: float, chunk: int) -> PruneResult:
        """Rows go in `seq` order, which is arrival order: walk from the cursor a chunk at a
        time, and stop at the first row that arrived after the cutoff."""
        seq = events.c.seq
        rows = self._x(
            select(seq, events.c.received_at).where(seq > after).order_by(seq).limit(chunk)
        )
        upto = None
        for position, received in rows:
            if received >= cutoff:
                break
            upto = int(position)
        if upto is None:
            return PruneResult(0, after, False)
        with self.tx():
            held = events.c.incident_id.is_(None)
            deleted = self._x(delete(events).where(seq > after, seq <= upto, held))
        backlog = len(rows) == chunk and upto == int(rows[-1][0])
        return PruneResult(max(deleted, 0), upto, backlog)

    def first_event_ts(self, incident_id: int) -> float | None:
        ts = self._scalar(select(func.min(events.c.ts)).where(events.c.incident_id == incident_id))
        return None if ts is None else float(ts)


def _answer(kind: str, field: str, value: str) -> Select[Any]:
    """Events of `kind` whose payload field `field` is `value`: the answers to one request."""
    return select(*_STORED).where(
        events.c.kind == kind, json_field(events.c.payload, field) == value
    )


def _sdc() -> Select[Any]:
    """Every rank's matmul SDC check answer."""
    check = func.coalesce(json_field(events.c.payload, "check"), "matmul")
    return select(*_STORED).where(events.c.kind == "rank.sdc", check == "matmul")
