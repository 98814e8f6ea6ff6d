"""Ingest: store events idempotently, keep the fleet and jobs as their reports say, and hand
each new event to correlation (`correlation.py`), which opens or joins its incident.

Runs in one transaction per batch (a savepoint inside the group commit), so a batch is either
wholly stored with everything it caused, or not at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core import lifecycle, stages
from sentinel.coordinator.core.correlation import Correlator
from sentinel.coordinator.core.playbooks import Playbook
from sentinel.coordinator.core.states import Entity, NodeState
from sentinel.coordinator.core.store import StateStore
from sentinel.protocol import (
    COORDINATOR_EVENTS,
    AgentHeartbeatEvent,
    Event,
    EventBatch,
    JobStatusEvent,
    NodeHealthEvent,
    RankLaunchEvent,
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
        self.correlator = Correlator(store, playbooks, cfg)

    def ingest_group(self, batches: list[EventBatch], now: float) -> list[IngestResult | Exception]:
        """Ingest batches that share one commit, in order; a batch that fails fails alone.

        A run of consecutive batches that can only store events and mark nodes seen (no event
        of theirs may open or join an incident: a healthy fleet's heartbeats and verdicts) is
        stored with one INSERT per chunk for the whole run, in a savepoint of its own; if that
        fails, its batches are tried one by one. Every other batch takes `ingest`.
        """
        passive = [self.correlator.passive(batch) for batch in batches]
        out: list[IngestResult | Exception] = []
        run: list[EventBatch] = []
        for batch, plain in zip(batches, passive, strict=True):
            if plain:
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
                if ev.source.node is not None and ev.kind not in COORDINATOR_EVENTS:
                    nodes[ev.source.node] = _verdict(ev) or nodes.get(ev.source.node)
                if isinstance(ev, JobStatusEvent):
                    self._track_job(ev, now)
                elif isinstance(ev, RankLaunchEvent):
                    stages.record_launch(self.store, ev)
                found = self.correlator.correlate(ev, now)
                if found is not None:
                    incident_id, opened = found
                    if opened:
                        result.opened.append(incident_id)
                    else:
                        result.linked += 1
                    self.store.link_events([(ev.id, incident_id)])
            self.store.touch_nodes(nodes, now)
        return result

    def _ingest_one(self, batch: EventBatch, now: float) -> IngestResult | Exception:
        try:
            return self.ingest(batch, now)  # a savepoint of its own
        except Exception as e:
            log.exception("ingest failed")
            return e

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
                        if node is not None and ev.kind not in COORDINATOR_EVENTS:
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

    def _track_job(self, ev: JobStatusEvent, now: float) -> None:
        if ev.source.job is None:
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


def _verdict(ev: Event) -> str | None:
    """The node's own verdict, which the events its agent sends about the node carry."""
    if isinstance(ev, NodeHealthEvent | AgentHeartbeatEvent):
        return ev.payload.verdict.value
    return None
