"""Correlation: which incident an event reports, opening one (with its first run) or joining one.

Correlation key: (fault class, scope). The scope comes from the playbook whose trigger matched
the event: `node` for hardware-like faults (eight GPUs of one node failing is one incident),
`job` for faults of the training run (every rank reporting the same loss spike is one
incident). Job-scoped keys include the job's generation: after a restart, a new spike is a new
incident. A symptom reported from a node that already has an active node-scoped incident (a
rank that died because its GPU fell off the bus) is linked to that incident instead of opening
another. A mitigated incident reported again after its cooldown opens again, with a new run.
An answer to the coordinator's own command (a recompute's digests quote its id) never opens an
incident: Sentinel's own outputs fed back in change nothing.

Triggers are compiled here into plain closures: ingest tries them against every event.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core import lifecycle
from sentinel.coordinator.core.playbooks import Condition, IncidentSpec, Playbook, TriggerClause
from sentinel.coordinator.core.rows import IncidentDetail, IncidentRow, JobRow
from sentinel.coordinator.core.states import (
    ACTIVE_INCIDENT,
    ENDED_JOBS,
    Entity,
    IncidentState,
    RunState,
)
from sentinel.coordinator.core.store import StateStore
from sentinel.faults.catalog import asks
from sentinel.protocol import (
    Action,
    Event,
    EventBatch,
    EventKind,
    JobStatusEvent,
    RankAnomalyEvent,
    RankCrashEvent,
    RankFrDumpEvent,
    RankHangEvent,
    RankSdcEvent,
    RankStepEvent,
    RankStragglerEvent,
)

Pred = Callable[[dict[str, Any]], bool]
_Candidate = tuple[Playbook, TriggerClause, Pred]
_GATE_TYPES = (str, int, float, bool)
_COUNT_LIMIT = 10_000  # events a trigger count reads at most
_JOBS_LIMIT = 10_000


def incident_key(spec: IncidentSpec, event: Event, generation: int) -> tuple[str, str] | None:
    """(key, target) for an event, or None when the event lacks what its scope needs."""
    if spec.scope == "node":
        if event.source.node is None:
            return None
        return f"{spec.fault}|node:{event.source.node}", event.source.node
    if event.source.job is None:
        return None
    return f"{spec.fault}|job:{event.source.job}#g{generation}", f"job:{event.source.job}"


class Correlator:
    """Turns stored events into incidents, inside ingest's transaction."""

    def __init__(
        self, store: StateStore, playbooks: list[Playbook], cfg: CoordinatorConfig
    ) -> None:
        self.store = store
        self.cfg = cfg
        by_kind: dict[EventKind, list[_Candidate]] = {}
        for book in playbooks:  # already sorted by priority
            for clause in book.trigger:
                pred = compile_clause(clause)
                for kind in clause.kinds:
                    by_kind.setdefault(kind, []).append((book, clause, pred))
        self._by_kind = {kind: _Triggers(cands) for kind, cands in by_kind.items()}
        self.absorbing = frozenset(
            p.incident.fault for p in playbooks if p.incident.absorbs_symptoms
        )

    def passive(self, batch: EventBatch) -> bool:
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

    def correlate(self, ev: Event, now: float) -> tuple[int, bool] | None:
        """(incident, whether it was opened now) that `ev` reports; None when it reports none."""
        if ev.source.node is not None and ev.source.rank is not None and self.absorbing:
            held = self.store.active_incident_on(ev.source.node, self.absorbing, ACTIVE_INCIDENT)
            if held is not None:  # a symptom of a fault already being handled on that node
                return held, False
        book = self._classify(ev)
        if book is None:
            return None
        job = self._job_of(ev)
        keyed = incident_key(book.incident, ev, job.generation if job else 0)
        if keyed is None:
            return None
        key, target = keyed
        self.store.lock_key(key)  # replicas ingesting the same fault at once open it once
        row = self.store.active_incident(key, ACTIVE_INCIDENT)
        if row is not None:
            self._link(row, ev, book, now)
            return row.id, False
        if isinstance(ev, RankSdcEvent) and self._issued(ev.payload.check_id):
            return None  # came after its incident (a late rank): it would recompute, evict again
        return self._open(ev, key, target, job, book, now), True

    def _issued(self, check_id: str | None) -> bool:
        """A command this coordinator issued (a check of the parameters adds `-params`)."""
        cid = None if check_id is None else check_id.removesuffix("-params")
        return cid is not None and self.store.command(cid) is not None

    def _classify(self, ev: Event) -> Playbook | None:
        triggers = self._by_kind.get(ev.kind)
        if triggers is None:
            return None
        doc = event_doc(ev)
        for book, clause, pred in triggers.candidates(doc):  # by priority, highest first
            if not pred(doc):
                continue
            if clause.min_count <= 1 or self._count(ev, clause) >= clause.min_count:
                return book
        return None

    def _count(self, ev: Event, clause: TriggerClause) -> int:
        """Matching events from the same node (or job) within the clause's window."""
        who, value = ("node", ev.source.node) if ev.source.node else ("job", ev.source.job)
        since = ev.ts - clause.window_s if clause.window_s else 0.0
        if value is None:
            return 0
        kinds = [str(k) for k in clause.kinds]
        pred = compile_clause(clause)
        return sum(
            pred(
                {
                    "kind": r.kind,
                    "payload": r.payload,
                    "source": {"node": r.node, "rank": r.rank, "job": r.job},
                }
            )
            for r in self.store.events_from(who, value, kinds, since, _COUNT_LIMIT)
        )

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
        return lifecycle.open_incident(
            self.store,
            key=key,
            fault=book.incident.fault,
            target=target,
            job=job.id if job else ev.source.job,
            run=self._first_run(book),
            now=now,
            first_step=step,
            detail=IncidentDetail(nodes=nodes, batch=batch, suspect_since=since),
            why=f"{ev.kind} from {target} matched {book.name}",
            audit_detail={"event": ev.id, "key": key},
        )

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
        lifecycle.create_run(self.store, row.id, *self._first_run(book), now)

    def _first_run(self, book: Playbook) -> tuple[str, RunState, bool]:
        """(playbook, state, dry run) of a run of `book`: approval first where its guards say."""
        status = RunState.AWAITING_APPROVAL if book.guards.require_approval else RunState.PENDING
        return book.name, status, book.runs_dry(self.store, self.cfg)


# --- triggers ----------------------------------------------------------------------------------


def compile_condition(cond: Condition) -> Pred:
    """A plain closure for the hot path: ingest checks it against every event."""
    if cond.any:
        alternatives = [compile_condition(c) for c in cond.any]
        return lambda doc: any(holds(doc) for holds in alternatives)
    path, op, want = cond.field.split("."), cond.op, cond.value
    if op == "exists":
        return lambda doc: bool(_resolve(doc, path)) == (want is not False)
    if op == "asks":
        wanted = frozenset(Action(a) for a in want)
        return lambda doc: any(asks(v) in wanted for v in _resolve(doc, path))
    if "*" not in path and op == "eq":  # the common case, without the generic walk
        get = compile_getter(path)
        return lambda doc: get(doc) == want
    return lambda doc: any(_compare(op, v, want) for v in _resolve(doc, path))


def compile_clause(clause: TriggerClause) -> Pred:
    preds = [compile_condition(c) for c in clause.when]

    def holds(doc: dict[str, Any]) -> bool:
        for pred in preds:  # noqa: SIM110 (a plain loop: this runs for every event)
            if not pred(doc):
                return False
        return True

    return holds


def compile_getter(path: list[str]) -> Callable[[dict[str, Any]], Any]:
    """`doc[a][b]…`, None where a level is missing; unrolled for the usual two levels."""
    if len(path) == 2:
        head, key = path

        def two(doc: dict[str, Any]) -> Any:
            node = doc.get(head)
            return node.get(key) if isinstance(node, dict) else None

        return two

    def walk(doc: dict[str, Any]) -> Any:
        node: Any = doc
        for key in path:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        return node

    return walk


def _resolve(node: Any, path: list[str]) -> list[Any]:
    if not path:
        return [node]
    head, rest = path[0], path[1:]
    if head == "*":
        items = node if isinstance(node, list) else []
        return [v for item in items for v in _resolve(item, rest)]
    if isinstance(node, dict) and head in node and node[head] is not None:
        return _resolve(node[head], rest)
    return []


_ORDER = {"gt": float.__gt__, "ge": float.__ge__, "lt": float.__lt__, "le": float.__le__}


_MATCH: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda got, want: bool(got == want),
    "ne": lambda got, want: bool(got != want),
    "in": lambda got, want: bool(got in want),
    "not_in": lambda got, want: bool(got not in want),
    "contains": lambda got, want: str(want) in str(got),
}


def _compare(op: str, got: Any, want: Any) -> bool:
    try:
        if op in _ORDER:
            return bool(_ORDER[op](float(got), float(want)))
        return op in _MATCH and _MATCH[op](got, want)
    except (TypeError, ValueError):
        return False


class _Triggers:
    """One event kind's trigger clauses, in priority order, behind a gate where one fits.

    When every clause requires the same field to equal a value (or be one of a list), that field
    is read once and only the clauses wanting its value are tried: a healthy node's health event
    tries none. Payloads are JSON values, so the table lookup agrees with the clauses' own `==`.
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
                for value in _wanted(cond) if cond.field == gate else []:
                    self.table.setdefault(value, []).append(cand)

    def may_match(self, ev: Event) -> bool:
        """Whether any clause can match `ev`: `candidates` without building its document."""
        if self.table is None:
            return bool(self.all)
        if self.payload_field is None:
            value = self.read(event_doc(ev))
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
    """The fields the clause wants equal to a value, or to one of a list of values."""
    return {c.field for c in clause.when if c.field and "*" not in c.field and _wanted(c)}


def _wanted(cond: Condition) -> list[Any]:
    """The values an `eq` or `in` condition wants, if every one can key a gate's table."""
    values = cond.value if cond.op == "in" else [cond.value] if cond.op == "eq" else []
    return values if all(isinstance(v, _GATE_TYPES) for v in values) else []


def event_doc(ev: Event) -> dict[str, Any]:
    """What trigger conditions read: the event as its JSON shape."""
    s = ev.source
    return {
        "kind": ev.kind.value,
        "payload": ev.payload.model_dump(mode="json"),
        "source": {"node": s.node, "rank": s.rank, "job": s.job},
    }


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
