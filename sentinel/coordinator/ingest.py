"""Ingest: store events idempotently, keep node/job state, and turn events into incidents.

Runs in one transaction per batch (a savepoint inside the group commit), so a batch is either
wholly stored with everything it caused, or not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sentinel.config import CoordinatorConfig
from sentinel.coordinator import lifecycle, stages
from sentinel.coordinator.incidents import Classification, incident_key
from sentinel.coordinator.lifecycle import (
    ACTIVE_INCIDENT,
    ENDED_JOBS,
    Entity,
    IncidentState,
    NodeState,
    RunState,
)
from sentinel.coordinator.playbooks import Playbook, TriggerClause, compile_getter
from sentinel.coordinator.store import StateStore
from sentinel.coordinator.store.rows import IncidentDetail, IncidentRow, JobRow
from sentinel.protocol import (
    AgentHeartbeatEvent,
    Event,
    EventBatch,
    EventKind,
    JobStatusEvent,
    NodeVerdictEvent,
    RankAnomalyEvent,
    RankCrashEvent,
    RankFrDumpEvent,
    RankHangEvent,
    RankLaunchEvent,
    RankSdcEvent,
    RankStepEvent,
    RankStragglerEvent,
)

log = logging.getLogger("sentinel.coordinator")


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    opened: list[int] = field(default_factory=list)
    linked: int = 0


class Ingestor:
    def __init__(
        self, store: StateStore, playbooks: list[Playbook], cfg: CoordinatorConfig
    ) -> None:
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
            new = self.store.insert_events(batch.events, now)
            nodes: dict[str, str | None] = {}
            for ev in batch.events:
                if ev.id not in new:
                    result.duplicates += 1  # stored before (a replay) or twice in this batch
                    continue
                new.discard(ev.id)
                result.accepted += 1
                if ev.source.node is not None:
                    nodes[ev.source.node] = _verdict(ev) or nodes.get(ev.source.node)
                self._track_job(ev, now)
                if isinstance(ev, RankLaunchEvent):
                    stages.record_launch(self.store, ev)
                incident_id = self._correlate(ev, now, result)
                if incident_id is not None:
                    self.store.link_events([(ev.id, incident_id)])
            self.store.touch_nodes(nodes, now)
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
            if ev.kind is EventKind.JOB_STATUS or ev.kind is EventKind.RANK_LAUNCH:
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
                new = self.store.insert_events([ev for b in batches for ev in b.events], now)
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
                            nodes[node] = _verdict(ev) or nodes.get(node)
                    results.append(result)
                self.store.touch_nodes(nodes, now)
        except Exception:
            if len(batches) == 1:
                return [self._ingest_one(batches[0], now)]
            log.warning("storing %d batches at once failed; storing them one by one", len(batches))
            return [self._ingest_one(b, now) for b in batches]
        return results

    # --- fleet and job state -----------------------------------------------------------------

    def _track_job(self, ev: Event, now: float) -> None:
        if not isinstance(ev, JobStatusEvent) or ev.source.job is None:
            return
        status = ev.payload
        lifecycle.report_job(self.store, ev.source.job, status, now)
        for node in status.nodes:
            lifecycle.add_node(self.store, node, NodeState.ACTIVE, now)
        for spare in status.spares:
            self._register_spare(spare, now)

    def _register_spare(self, name: str, now: float) -> None:
        """An idle spare whose agent reported before the job did was recorded as active; it is
        a spare. One a playbook swapped in (reason set) stays active."""
        if lifecycle.add_node(self.store, name, NodeState.SPARE, now):
            return
        node = self.store.node(name)
        if node is not None and node.state == NodeState.ACTIVE and node.reason is None:
            lifecycle.move(
                self.store, Entity.NODE, name, NodeState.SPARE, now, "coordinator", "job's spare"
            )

    # --- correlation -------------------------------------------------------------------------

    def _correlate(self, ev: Event, now: float, result: IngestResult) -> int | None:
        if ev.source.node is not None and ev.source.rank is not None and self.absorbing:
            held = self.store.active_incident_on(ev.source.node, self.absorbing, ACTIVE_INCIDENT)
            if held is not None:  # a symptom of a fault already being handled on that node
                result.linked += 1
                return held
        book = self._classify(ev)
        if book is None:
            return None
        cls = Classification(book.incident.fault, book.incident.scope, book.name)
        job = self._job_of(ev)
        generation = job.generation if job else 0
        keyed = incident_key(cls, ev, generation)
        if keyed is None:
            return None
        key, target = keyed
        self.store.lock_key(key)  # replicas ingesting the same fault at once open it once
        row = self.store.active_incident(key, ACTIVE_INCIDENT)
        if row is not None:
            result.linked += 1
            self._link(row, ev, book, now)
            return row.id
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
        if value is None:
            return 0
        kinds = [str(k) for k in clause.kinds]
        count = 0
        for r in self.store.events_from(who, value, kinds, since, _COUNT_LIMIT):
            doc = {
                "kind": r.kind,
                "payload": r.payload,
                "source": {"node": r.node, "rank": r.rank, "job": r.job},
            }
            count += all(c.holds(doc) for c in clause.when)
        return count

    def _job_of(self, ev: Event) -> JobRow | None:
        if ev.source.job is not None:
            return self.store.job(ev.source.job)
        if ev.source.node is None:
            return None
        for job in self.store.jobs(_JOBS_LIMIT, exclude_states=ENDED_JOBS):
            if ev.source.node in job.status.nodes:
                return job
        return None

    def _open(
        self,
        ev: Event,
        cls: Classification,
        key: str,
        target: str,
        job: JobRow | None,
        book: Playbook,
        now: float,
    ) -> int:
        step, batch, since = _where(ev)
        if step is None and job is not None:
            step = job.status.step
        nodes = [ev.source.node] if ev.source.node else []
        detail = IncidentDetail(nodes=nodes, batch=batch, suspect_since=since)
        incident_id = lifecycle.open_incident(
            self.store,
            key=key,
            fault=cls.fault,
            target=target,
            job=job.id if job else ev.source.job,
            playbook=book.name,
            now=now,
            first_step=step,
            detail=detail,
            why=f"{ev.kind} from {target} matched {book.name}",
            audit_detail={"event": ev.id, "key": key},
        )
        self.start_run(incident_id, book, now)
        return incident_id

    def _link(self, row: IncidentRow, ev: Event, book: Playbook, now: float) -> None:
        detail = row.detail
        if ev.source.node and ev.source.node not in detail.nodes:
            detail.nodes.append(ev.source.node)
        self.store.save_incident_detail(row.id, detail, now)
        if row.state != IncidentState.MITIGATED:
            return
        last = self.store.last_run_update(row.id)
        cooldown = book.guards.cooldown_s
        cooldown = self.cfg.default_cooldown_s if cooldown is None else cooldown
        if last is not None and now - last < cooldown:
            return  # an aftershock of what was just handled
        lifecycle.move(
            self.store,
            Entity.INCIDENT,
            row.id,
            IncidentState.OPEN,
            now,
            "coordinator",
            f"fault reported again after the {cooldown:g} s cooldown",
            incident_id=row.id,
            what="incident.recur",
            detail={"event": ev.id},
        )
        self.start_run(row.id, book, now)

    def start_run(self, incident_id: int, book: Playbook, now: float) -> int:
        status = RunState.AWAITING_APPROVAL if book.guards.require_approval else RunState.PENDING
        dry = book.guards.dry_run or self.cfg.dry_run
        return lifecycle.create_run(self.store, incident_id, book.name, status, dry, now)


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
        self.payload_field: str | None = None
        shared = set.intersection(*(_eq_fields(clause) for _, clause, _ in candidates))
        if not shared:
            return
        gate = min(shared)
        self.read = compile_getter(gate.split("."))
        # A gate on a top-level payload field (the usual case) is read off the event's payload
        # model itself, without building the event's document.
        head, _, key = gate.partition(".")
        self.payload_field = key if head == "payload" and key and "." not in key else None
        self.table = {}
        for cand in candidates:
            for cond in cand[1].when:
                if cond.field == gate and cond.op == "eq":
                    self.table.setdefault(cond.value, []).append(cand)

    def may_match(self, ev: Event) -> bool:
        """Whether any clause can match `ev`: `candidates` without building its document."""
        if self.table is None:
            return bool(self.all)
        if self.payload_field is None:
            value = self.read(_doc(ev))
        else:  # the field a playbook names, or None where this kind has no such field
            value = getattr(ev.payload, self.payload_field, None)
            if isinstance(value, Enum):
                value = value.value  # the document holds the enum's JSON value
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


_COUNT_LIMIT = 10_000  # events a trigger count reads at most
_JOBS_LIMIT = 10_000


def _doc(ev: Event) -> dict[str, Any]:
    """What trigger conditions read: the event as its JSON shape."""
    s = ev.source
    return {
        "kind": ev.kind.value,
        "payload": ev.payload.model_dump(mode="json"),
        "source": {"node": s.node, "rank": s.rank, "job": s.job},
    }


def _verdict(ev: Event) -> str | None:
    """The node's own verdict, which the events its agent sends about the node carry."""
    if isinstance(ev, NodeVerdictEvent | AgentHeartbeatEvent):
        return ev.payload.verdict.value
    return None


def _where(ev: Event) -> tuple[int | None, int | None, int | None]:
    """(step, batch, suspect_since): where in training an event puts its fault, as far as its
    kind says."""
    match ev:
        case RankAnomalyEvent():
            return ev.payload.step, ev.payload.batch, None
        case RankSdcEvent():
            return ev.payload.step, None, ev.payload.suspect_since
        case (
            RankHangEvent()
            | RankStragglerEvent()
            | RankStepEvent()
            | RankFrDumpEvent()
            | RankCrashEvent()
            | JobStatusEvent()
        ):
            return ev.payload.step, None, None
    return None, None, None
