"""Ingest: store events idempotently, keep node/job state, and turn events into incidents.

Runs in one transaction per batch (a savepoint inside the group commit), so a batch is either
wholly stored with everything it caused, or not at all.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, TypeVar

from pydantic_core import to_json

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.incidents import (
    ACTIVE_STATES,
    Classification,
    IncidentState,
    check_transition,
    incident_key,
)
from sentinel.coordinator.playbooks import Playbook, TriggerClause, compile_getter
from sentinel.coordinator.store import Store, dumps
from sentinel.protocol import Event, EventBatch, EventKind

_ACTIVE = tuple(str(s) for s in ACTIVE_STATES)
log = logging.getLogger("sentinel.coordinator")


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    opened: list[int] = field(default_factory=list)
    linked: int = 0


class Ingestor:
    def __init__(self, store: Store, playbooks: list[Playbook], cfg: CoordinatorConfig) -> None:
        self.store = store
        self.playbooks = playbooks
        self.cfg = cfg
        by_kind: dict[EventKind, list[_Candidate]] = {}
        for book in playbooks:  # already sorted by priority
            for clause in book.trigger:
                pred = clause.compile()
                for kind in clause.kinds:
                    by_kind.setdefault(kind, []).append((book, clause, pred))
        self._by_kind = {kind: _Triggers(cands) for kind, cands in by_kind.items()}
        self.absorbing = frozenset(
            p.incident.fault for p in playbooks if p.incident.absorbs_symptoms
        )

    def ingest_group(self, batches: list[EventBatch], now: float) -> list[IngestResult | Exception]:
        """Ingest batches that share one commit, in order; a batch that fails fails alone.

        A run of consecutive batches that can only store events and mark nodes seen (no event
        of theirs may open or join an incident: a healthy fleet's heartbeats and verdicts) is
        stored with one INSERT per chunk for the whole run, in a savepoint of its own; if that
        fails, its batches are tried one by one. Every other batch takes `ingest`.
        """
        out: list[IngestResult | Exception] = []
        run: list[EventBatch] = []
        for batch in batches:
            if self._plain(batch):
                run.append(batch)
                continue
            if run:
                out += self._ingest_plain_run(run, now)
                run = []
            out.append(self._ingest_one(batch, now))
        if run:
            out += self._ingest_plain_run(run, now)
        return out

    def ingest(self, batch: EventBatch, now: float) -> IngestResult:
        result = IngestResult()
        with self.store.tx():
            new = self._insert_new(batch.events, now)
            nodes: dict[str, str | None] = {}
            for ev in batch.events:
                if ev.id not in new:
                    result.duplicates += 1  # stored before (a replay) or twice in this batch
                    continue
                new.discard(ev.id)
                result.accepted += 1
                if ev.source.node is not None:
                    verdict = ev.payload.get("verdict") if ev.kind in _VERDICT_KINDS else None
                    nodes[ev.source.node] = verdict or nodes.get(ev.source.node)
                self._track_job(ev, now)
                incident_id = self._correlate(ev, now, result)
                if incident_id is not None:
                    self.store.execute(
                        "UPDATE events SET incident_id=? WHERE id=?", (incident_id, ev.id)
                    )
            self._track_nodes(nodes, now)
        return result

    def _ingest_one(self, batch: EventBatch, now: float) -> IngestResult | Exception:
        try:
            return self.ingest(batch, now)  # a savepoint of its own
        except Exception as e:
            log.exception("ingest failed")
            return e

    def _plain(self, batch: EventBatch) -> bool:
        """Whether no event of the batch can do more than be stored and mark its node seen."""
        by_kind, absorbing = self._by_kind, bool(self.absorbing)
        for ev in batch.events:
            if ev.kind is EventKind.JOB_STATUS:
                return False
            triggers = by_kind.get(ev.kind)
            if triggers is not None and triggers.may_match(ev):
                return False
            if absorbing and ev.source.rank is not None and ev.source.node is not None:
                return False
        return True

    def _ingest_plain_run(
        self, batches: list[EventBatch], now: float
    ) -> list[IngestResult | Exception]:
        try:
            with self.store.tx():
                new = self._insert_new([ev for b in batches for ev in b.events], now)
                results: list[IngestResult | Exception] = []
                nodes: dict[str, str | None] = {}
                for batch in batches:
                    result = IngestResult()
                    for ev in batch.events:
                        if ev.id not in new:
                            result.duplicates += 1  # stored before, or earlier in this run
                            continue
                        new.discard(ev.id)
                        result.accepted += 1
                        node = ev.source.node
                        if node is not None:
                            verdict = (
                                ev.payload.get("verdict") if ev.kind in _VERDICT_KINDS else None
                            )
                            nodes[node] = verdict or nodes.get(node)
                    results.append(result)
                self._track_nodes(nodes, now)
        except Exception:
            if len(batches) == 1:
                return [self._ingest_one(batches[0], now)]
            log.warning("storing %d batches at once failed; storing them one by one", len(batches))
            return [self._ingest_one(b, now) for b in batches]
        return results

    def _insert_new(self, events: list[Event], now: float) -> set[str]:
        """Insert every event not stored yet; the ids inserted.

        Chunks of fixed sizes (256, then powers of two) keep the statements few and cached. A
        chunk all of whose rows went in (the rule: ids are unique) needs no lookup; only one
        with a replayed or repeated id asks which went in. `events` is a rowid table, so the
        rows one statement inserts take consecutive rowids ending at the last one inserted.
        """
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
                now,
            )
            for ev in events
        ]
        for chunk in _chunks(rows):
            cur = self.store.execute(
                _values_sql(_INSERT_EVENTS, "(?,?,?,?,?,?,?,?)", len(chunk)),
                tuple(chain.from_iterable(chunk)),
            )
            inserted, last = cur.rowcount, cur.lastrowid
            if inserted == len(chunk):
                new.update(row[0] for row in chunk)
            elif inserted > 0 and last is not None:
                new.update(
                    r["id"]
                    for r in self.store.query(
                        "SELECT id FROM events WHERE rowid BETWEEN ? AND ?",
                        (last - inserted + 1, last),
                    )
                )
        return new

    # --- fleet and job state -----------------------------------------------------------------

    def _track_nodes(self, nodes: dict[str, str | None], now: float) -> None:
        # One statement per chunk, not one step per node: every statement the store thread runs
        # hands the GIL back and forth with the event loop, which costs most under load.
        rows = [(node, now, verdict) for node, verdict in nodes.items()]
        for chunk in _chunks(rows):
            self.store.execute(
                _values_sql(_UPSERT_NODES, "(?,?,?,'active')", len(chunk), _UPSERT_NODES_TAIL),
                tuple(chain.from_iterable(chunk)),
            )

    def _track_job(self, ev: Event, now: float) -> None:
        if ev.kind == EventKind.JOB_STATUS and ev.source.job is not None:
            p = ev.payload
            self.store.execute(
                "INSERT INTO jobs (id, state, generation, last_heartbeat, status)"
                " VALUES (?,?,?,?,?)"
                " ON CONFLICT(id) DO UPDATE SET state=excluded.state,"
                " generation=excluded.generation, last_heartbeat=excluded.last_heartbeat,"
                " status=excluded.status",
                (ev.source.job, p["state"], p["generation"], now, dumps(p)),
            )
            self.store.executemany(
                "INSERT OR IGNORE INTO nodes (name, state, state_changed_at) VALUES (?,'active',?)",
                [(n, now) for n in p["nodes"]],
            )
            # An idle spare whose agent reported before the job did was recorded as active;
            # it is a spare. One a playbook swapped in (reason set) stays active.
            self.store.executemany(
                "INSERT INTO nodes (name, state, state_changed_at) VALUES (?,'spare',?)"
                " ON CONFLICT(name) DO UPDATE SET state='spare'"
                " WHERE nodes.state='active' AND nodes.reason IS NULL",
                [(s, now) for s in p["spares"]],
            )

    # --- correlation -------------------------------------------------------------------------

    def _correlate(self, ev: Event, now: float, result: IngestResult) -> int | None:
        if ev.source.node is not None and ev.source.rank is not None and self.absorbing:
            marks = ",".join("?" * len(self.absorbing))
            row = self.store.one(
                f"SELECT id FROM incidents WHERE target=? AND fault IN ({marks})"
                f" AND state IN ({','.join('?' * len(_ACTIVE))}) ORDER BY id LIMIT 1",
                (ev.source.node, *sorted(self.absorbing), *_ACTIVE),
            )
            if row is not None:  # a symptom of a fault already being handled on that node
                result.linked += 1
                return int(row["id"])
        book = self._classify(ev)
        if book is None:
            return None
        cls = Classification(book.incident.fault, book.incident.scope, book.name)
        job = self._job_of(ev)
        generation = int(job["generation"]) if job else 0
        keyed = incident_key(cls, ev, generation)
        if keyed is None:
            return None
        key, target = keyed
        row = self.store.one(
            f"SELECT * FROM incidents WHERE key=? AND state IN ({','.join('?' * len(_ACTIVE))})"
            " ORDER BY id DESC LIMIT 1",
            (key, *_ACTIVE),
        )
        if row is not None:
            result.linked += 1
            self._link(row, ev, book, now)
            return int(row["id"])
        incident_id = self._open(ev, cls, key, target, job, book, now)
        result.opened.append(incident_id)
        return incident_id

    def _classify(self, ev: Event) -> Playbook | None:
        triggers = self._by_kind.get(ev.kind)
        if triggers is None:
            return None
        doc = _doc(ev)
        for book, clause, pred in triggers.candidates(doc):  # by priority, highest first
            if not pred(doc):
                continue
            if clause.min_count <= 1 or self._count(ev, clause) >= clause.min_count:
                return book
        return None

    def _count(self, ev: Event, clause: Any) -> int:
        """Matching events from the same node (or job) within the clause's window."""
        who, value = ("node", ev.source.node) if ev.source.node else ("job", ev.source.job)
        since = ev.ts - clause.window_s if clause.window_s else 0.0
        kinds = [str(k) for k in clause.kinds]
        rows = self.store.query(
            f"SELECT id, kind, node, rank, job, ts, payload FROM events WHERE {who}=?"
            f" AND kind IN ({','.join('?' * len(kinds))}) AND ts>=? LIMIT 10000",
            (value, *kinds, since),
        )
        count = 0
        for r in rows:
            doc = {
                "kind": r["kind"],
                "payload": r["payload"],
                "source": {"node": r["node"], "rank": r["rank"], "job": r["job"]},
            }
            count += all(c.holds(doc) for c in clause.when)
        return count

    def _job_of(self, ev: Event) -> dict[str, Any] | None:
        if ev.source.job is not None:
            return self.store.one("SELECT * FROM jobs WHERE id=?", (ev.source.job,))
        if ev.source.node is None:
            return None
        for job in self.store.query("SELECT * FROM jobs WHERE state != 'finished'"):
            if ev.source.node in job["status"].get("nodes", []):
                return job
        return None

    def _open(
        self,
        ev: Event,
        cls: Classification,
        key: str,
        target: str,
        job: dict[str, Any] | None,
        book: Playbook,
        now: float,
    ) -> int:
        step = ev.payload.get("step")
        if step is None and job is not None:
            step = job["status"].get("step")
        detail: dict[str, Any] = {"nodes": [ev.source.node] if ev.source.node else []}
        for name in ("batch", "suspect_since"):  # what a rollback or a skip needs to know
            if ev.payload.get(name) is not None:
                detail[name] = ev.payload[name]
        cur = self.store.execute(
            "INSERT INTO incidents (key, fault, target, job, state, playbook, opened_at,"
            " updated_at, first_step, detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                key,
                cls.fault,
                target,
                job["id"] if job else ev.source.job,
                IncidentState.OPEN,
                book.name,
                now,
                now,
                step,
                dumps(detail),
            ),
        )
        incident_id = int(cur.lastrowid or 0)
        self.store.audit(
            now,
            "coordinator",
            "incident.open",
            f"{ev.kind} from {target} matched {book.name}",
            incident_id,
            {"event": ev.id, "key": key},
        )
        self.start_run(incident_id, book, now)
        return incident_id

    def _link(self, row: dict[str, Any], ev: Event, book: Playbook, now: float) -> None:
        detail = row["detail"]
        if ev.source.node and ev.source.node not in detail.setdefault("nodes", []):
            detail["nodes"].append(ev.source.node)
        self.store.execute(
            "UPDATE incidents SET detail=?, updated_at=? WHERE id=?",
            (dumps(detail), now, row["id"]),
        )
        if row["state"] != IncidentState.MITIGATED:
            return
        last = self.store.one(
            "SELECT MAX(updated_at) AS t FROM runs WHERE incident_id=?", (row["id"],)
        )
        cooldown = book.guards.cooldown_s
        cooldown = self.cfg.default_cooldown_s if cooldown is None else cooldown
        if last and last["t"] is not None and now - float(last["t"]) < cooldown:
            return  # an aftershock of what was just handled
        check_transition(IncidentState.MITIGATED, IncidentState.OPEN)
        self.store.execute(
            "UPDATE incidents SET state='open', updated_at=? WHERE id=?", (now, row["id"])
        )
        self.store.audit(
            now,
            "coordinator",
            "incident.recur",
            f"fault reported again after the {cooldown:g} s cooldown",
            int(row["id"]),
            {"event": ev.id},
        )
        self.start_run(int(row["id"]), book, now)

    def start_run(self, incident_id: int, book: Playbook, now: float) -> int:
        status = "awaiting_approval" if book.guards.require_approval else "pending"
        dry = book.guards.dry_run or self.cfg.dry_run
        cur = self.store.execute(
            "INSERT INTO runs (incident_id, playbook, status, dry_run, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?)",
            (incident_id, book.name, status, int(dry), now, now),
        )
        return int(cur.lastrowid or 0)


_Pred = Callable[[dict[str, Any]], bool]
_Candidate = tuple[Playbook, TriggerClause, _Pred]
_GATE_TYPES = (str, int, float, bool)


class _Triggers:
    """One event kind's trigger clauses, in priority order, behind a gate where one fits.

    When every clause requires `field eq value` of the same field, that field is read once and
    only the clauses wanting its value are tried: a healthy GPU's verdict tries none. Payloads
    are JSON values, so the table lookup agrees with the clauses' own `==`.
    """

    def __init__(self, candidates: list[_Candidate]) -> None:
        self.all = candidates
        self.table: dict[object, list[_Candidate]] | None = None
        self.payload_key: str | None = None
        shared = set.intersection(*(_eq_fields(clause) for _, clause, _ in candidates))
        if not shared:
            return
        gate = min(shared)
        self.read = compile_getter(gate.split("."))
        # A gate on a top-level payload field (the usual case) is read off the event itself.
        head, _, key = gate.partition(".")
        self.payload_key = key if head == "payload" and key and "." not in key else None
        self.table = {}
        for cand in candidates:
            for cond in cand[1].when:
                if cond.field == gate and cond.op == "eq":
                    self.table.setdefault(cond.value, []).append(cand)

    def may_match(self, ev: Event) -> bool:
        """Whether any clause can match `ev`: `candidates` without building its document."""
        if self.table is None:
            return bool(self.all)
        value = ev.payload.get(self.payload_key) if self.payload_key else self.read(_doc(ev))
        return isinstance(value, _GATE_TYPES) and bool(self.table.get(value))

    def candidates(self, doc: dict[str, Any]) -> list[_Candidate]:
        if self.table is None:
            return self.all
        value = self.read(doc)
        return self.table.get(value, []) if isinstance(value, _GATE_TYPES) else []


def _eq_fields(clause: TriggerClause) -> set[str]:
    return {
        c.field
        for c in clause.when
        if c.op == "eq" and "*" not in c.field and isinstance(c.value, _GATE_TYPES)
    }


_CHUNK = 256  # rows per INSERT statement at most (8 parameters each for events)
_INSERT_EVENTS = (
    "INSERT OR IGNORE INTO events (id, kind, node, rank, job, ts, payload, received_at) VALUES "
)
_UPSERT_NODES = "INSERT INTO nodes (name, last_seen, verdict, state) VALUES "
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


def _doc(ev: Event) -> dict[str, Any]:
    """What trigger conditions read: the event as its JSON shape."""
    s = ev.source
    return {
        "kind": ev.kind.value,
        "payload": ev.payload,
        "source": {"node": s.node, "rank": s.rank, "job": s.job},
    }


_VERDICT_KINDS = frozenset({EventKind.NODE_VERDICT, EventKind.AGENT_HEARTBEAT})
