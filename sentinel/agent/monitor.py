"""One collection pass: sweep the GPUs and the host, judge health, and say what changed.

Pure of I/O beyond the backends it is given, so tests drive it pass by pass with no server.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sentinel.agent.health import GpuHealth, HealthEvaluator, NodeHealth
from sentinel.agent.host import HostSource, HostStats
from sentinel.agent.readings import GpuBackend, GpuReading
from sentinel.protocol import (
    Event,
    EventKind,
    GpuVerdictPayload,
    NodeVerdictPayload,
    Source,
    Verdict,
    XidPayload,
    make_event,
)

log = logging.getLogger("sentinel.agent")


@dataclass(frozen=True, slots=True)
class Snapshot:
    ts: float
    readings: tuple[GpuReading, ...]
    health: NodeHealth
    host: HostStats | None
    sweep_s: float


@dataclass
class XidTally:
    """Per-XID counts (dcgm-exporter only keeps the last XID per GPU) and the last one seen."""

    counts: Counter[tuple[int, int]] = field(default_factory=Counter)  # (gpu, xid) -> n
    last: dict[int, int] = field(default_factory=dict)  # gpu -> last xid


class NodeMonitor:
    def __init__(
        self,
        node_id: str,
        backend: GpuBackend,
        host: HostSource | None,
        evaluator: HealthEvaluator,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = Source(node=node_id)
        self.backend = backend
        self.host = host
        self.evaluator = evaluator
        self.clock = clock
        self.xids = XidTally()
        self.snapshot: Snapshot | None = None
        self._gpu_verdicts: dict[int, tuple[Verdict, str]] = {}
        self._node_verdict: tuple[Verdict, str] | None = None

    def collect(self) -> tuple[Snapshot, list[Event]]:
        start = time.perf_counter()
        readings = tuple(self.backend.sweep())
        xids = self.backend.drain_xids()
        host = self.host.read() if self.host is not None else None
        health = self.evaluator.evaluate(readings, xids)
        sweep_s = time.perf_counter() - start
        snapshot = Snapshot(self.clock(), readings, health, host, sweep_s)
        events = self._xid_events(health) + self._verdict_events(health)
        self.snapshot = snapshot
        return snapshot, events

    def _xid_events(self, health: NodeHealth) -> list[Event]:
        events = []
        for x in health.xids:
            self.xids.counts[(x.gpu, x.xid)] += 1
            self.xids.last[x.gpu] = x.xid
            log.warning(
                "XID %d on GPU %d: %s",
                x.xid,
                x.gpu,
                x.name,
                extra={"action": x.action.value, "repeats": x.repeats_in_window},
            )
            payload = XidPayload(
                gpu=x.gpu,
                uuid=x.uuid,
                xid=x.xid,
                name=x.name,
                action=x.action,
                repeats_in_window=x.repeats_in_window,
            )
            events.append(make_event(EventKind.GPU_XID, self.source, payload, ts=self.clock()))
        return events

    def _verdict_events(self, health: NodeHealth) -> list[Event]:
        events = [e for g in health.gpus if (e := self._gpu_change(g)) is not None]
        now = (health.verdict, health.action.value)
        if now != self._node_verdict:
            previous = self._node_verdict[0] if self._node_verdict else None
            self._node_verdict = now
            log.info(
                "node verdict %s",
                health.verdict.value,
                extra={"previous": previous, "action": health.action.value},
            )
            payload = NodeVerdictPayload(
                verdict=health.verdict,
                previous=previous,
                action=health.action,
                unhealthy_gpus=[g.gpu for g in health.gpus if g.verdict == Verdict.UNHEALTHY],
                findings=list(health.findings),
            )
            events.append(make_event(EventKind.NODE_VERDICT, self.source, payload, ts=self.clock()))
        return events

    def _gpu_change(self, g: GpuHealth) -> Event | None:
        now = (g.verdict, g.action.value)
        before = self._gpu_verdicts.get(g.gpu)
        if now == before:
            return None
        self._gpu_verdicts[g.gpu] = now
        if before is None and g.verdict == Verdict.HEALTHY:
            return None  # a healthy GPU at start is no news; the node verdict covers it
        log.info(
            "GPU %d verdict %s",
            g.gpu,
            g.verdict.value,
            extra={
                "previous": before[0].value if before else None,
                "action": g.action.value,
                "reasons": "; ".join(f.detail for f in g.findings),
            },
        )
        payload = GpuVerdictPayload(
            gpu=g.gpu,
            uuid=g.uuid,
            verdict=g.verdict,
            previous=before[0] if before else None,
            action=g.action,
            findings=list(g.findings),
        )
        return make_event(EventKind.GPU_VERDICT, self.source, payload, ts=self.clock())
