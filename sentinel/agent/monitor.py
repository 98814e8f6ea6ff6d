"""One collection pass: sweep the GPUs and the host, judge health, and say what changed.

Pure of I/O beyond the backends it is given, so tests drive it pass by pass with no server.
Two threads touch it: the sweep thread runs `collect`, the event loop runs `check_stall` and
`poll_kernel` (the kernel log and a wedged NVML must move the verdict while no sweep can
finish). A lock orders their judgements; NVML itself is called outside it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sentinel.agent.health.judge import (
    GpuHealth,
    HealthEvaluator,
    NodeHealth,
    RecentXid,
    XidOutcome,
)
from sentinel.agent.health.kmsg import KernelLog, KernelXid, XidPairing, normal_bus_id
from sentinel.agent.health.node_rules import NodeSignals, Report
from sentinel.agent.health.sources import HOST, KMSG, SourceStates
from sentinel.agent.host import HostSource, HostStats
from sentinel.agent.nvml.deadline import Stall
from sentinel.agent.nvml.readings import GpuBackend, GpuReading, XidEvent
from sentinel.protocol import (
    Event,
    GpuVerdict,
    NodeHealthEvent,
    NodeHealthPayload,
    Source,
    Verdict,
    XidReport,
)

log = logging.getLogger("sentinel.agent")


@dataclass(frozen=True, slots=True)
class Snapshot:
    ts: float
    readings: tuple[GpuReading, ...]
    health: NodeHealth
    host: HostStats | None
    sweep_s: float
    stall: Stall | None = None  # an NVML call past its deadline, as of this snapshot


@dataclass
class XidTally:
    """Per-XID counts (dcgm-exporter only keeps the last XID per GPU) and the last one seen."""

    counts: Counter[tuple[int, int]] = field(default_factory=Counter)  # (gpu, xid) -> n
    last: dict[int, int] = field(default_factory=dict)  # gpu -> last xid
    sources: Counter[str] = field(default_factory=Counter)  # "nvml" / "kmsg" -> XIDs admitted


@dataclass(frozen=True, slots=True)
class XidHistory:
    """What the agent knows of this node's XIDs, read at one moment (see `xid_history`)."""

    counts: dict[tuple[int, int], int]  # (gpu, xid) -> occurrences since the agent started
    last: dict[int, int]  # gpu -> its last xid
    sources: dict[str, int]  # "nvml" / "kmsg" -> XIDs admitted from each
    recent: tuple[RecentXid, ...]  # inside the evaluator's window, with their arrivals


class NodeMonitor:
    def __init__(
        self,
        node_id: str,
        backend: GpuBackend,
        host: HostSource | None,
        evaluator: HealthEvaluator,
        clock: Callable[[], float] = time.time,
        *,
        expected_gpus: int | None = None,
        kernel_log: KernelLog | None = None,
        host_interval_s: float = 0.0,
        sources: SourceStates | None = None,
    ) -> None:
        self.source = Source(node=node_id)
        self.backend = backend
        self.host = host
        self.host_interval_s = host_interval_s
        self._host_stats: HostStats | None = None
        self._host_read_at = -math.inf  # self.clock() at the last host read
        self.evaluator = evaluator
        self.clock = clock
        self.expected_gpus = expected_gpus
        self.kernel_log = kernel_log
        self.sources = sources or SourceStates(())
        self.xids = XidTally()
        self.pairing = XidPairing()
        self.snapshot: Snapshot | None = None
        self.last_sweep_ts = 0.0  # wall clock of the last full sweep
        self._gpu_verdicts: dict[int, tuple[Verdict, str]] = {}
        self._node_verdict: tuple[Verdict, str] | None = None
        self._lock = threading.Lock()
        self._stall: Stall | None = None
        self._reports: list[Report] = []  # kernel-log findings not yet judged
        self._kernel_xids: list[XidEvent] = []

    # ---- the sweep (sweep thread) -------------------------------------------------------------

    def collect(self) -> tuple[Snapshot, list[Event]]:
        start = time.perf_counter()
        readings = tuple(self.backend.sweep())
        nvml_xids = self.backend.drain_xids()
        host = self._read_host()
        with self._lock:
            self._stall = None  # every call of a full sweep returned: NVML answers
            now = self.clock()
            xids = [
                x for x in nvml_xids if x.gpu >= 0 and self.pairing.admit("nvml", x.gpu, x.xid, now)
            ]
            self._reports += [
                Report("unknown_signal", f"Xid {x.xid} from a device NVML did not name")
                for x in nvml_xids
                if x.gpu < 0
            ]
            self.xids.sources["nvml"] += len(xids)
            xids += self._kernel_xids
            self._kernel_xids = []
            health = self.evaluator.evaluate(readings, xids, self._signals(len(readings)))
            snapshot = Snapshot(now, readings, health, host, time.perf_counter() - start)
            self.last_sweep_ts = now
            return snapshot, self._publish(snapshot)

    def _read_host(self) -> HostStats | None:
        """The host's statistics, read again once `host_interval_s` has passed since the last
        read; between reads, sweeps carry the last ones."""
        now = self.clock()
        due = not 0 <= now - self._host_read_at < self.host_interval_s  # or the clock stepped back
        if self.host is not None and due:
            self._host_read_at = now
            try:
                self._host_stats = self.host.read()
            except Exception as e:  # the GPUs are still read: the sweep carries no host stats
                self._host_stats = None
                self.sources.mark(HOST, f"{type(e).__name__}: {e}")
            else:
                self.sources.mark(HOST, None)
        return self._host_stats

    # ---- between sweeps (event loop) ----------------------------------------------------------

    def check_stall(self, stall: Stall | None) -> list[Event]:
        """A call past its deadline turns the node unhealthy now, naming the call."""
        with self._lock:
            if stall is None or self.snapshot is None:
                return []
            self._stall = stall
            return self._recompose()

    def poll_kernel(self) -> list[Event]:
        """Read the kernel log; its host findings move the verdict at once, its XIDs join the
        next sweep (or judge now when NVML is stuck)."""
        if self.kernel_log is None:
            return []
        kernel_xids, reports = self.kernel_log.poll()
        self.sources.mark(KMSG, self.kernel_log.problem)
        with self._lock:
            self._reports += reports
            self._kernel_xids += self._admit_kernel_xids(kernel_xids)
            if self.snapshot is None or not (reports or self._stall):
                return []
            return self._recompose()

    def xid_history(self) -> XidHistory:
        """The tally and the evaluator's window, copied under the lock the sweep thread judges
        under: read from the event loop, a judgement half done would tear them."""
        with self._lock:
            t = self.xids
            recent = tuple(self.evaluator.recent_xids())
            return XidHistory(dict(t.counts), dict(t.last), dict(t.sources), recent)

    def _admit_kernel_xids(self, found: list[KernelXid]) -> list[XidEvent]:
        if not found:  # nearly every poll: no need to index the GPUs by bus
            return []
        by_bus = {
            normal_bus_id(r.pci_bus_id): r for r in self._readings() if r.pci_bus_id is not None
        }
        now, admitted = self.clock(), []
        for k in found:
            reading = by_bus.get(k.pci_bus_id)
            if reading is None:  # a GPU NVML does not list (see gpu_missing)
                self._reports.append(
                    Report("unknown_signal", f"Xid {k.xid} on PCI {k.pci_bus_id}, not an NVML GPU")
                )
                continue
            if self.pairing.admit("kmsg", reading.index, k.xid, now):
                self.xids.sources["kmsg"] += 1
                admitted.append(XidEvent(reading.index, k.xid, reading.uuid, now))
        return admitted

    def _readings(self) -> tuple[GpuReading, ...]:
        return self.snapshot.readings if self.snapshot is not None else ()

    def _recompose(self) -> list[Event]:
        assert self.snapshot is not None
        xids, self._kernel_xids = self._kernel_xids, []
        health = self.evaluator.recompose(self._signals(len(self.snapshot.readings)), xids)
        snap = self.snapshot
        snapshot = Snapshot(self.clock(), snap.readings, health, snap.host, snap.sweep_s)
        return self._publish(snapshot)

    def _signals(self, visible: int) -> NodeSignals:
        reports, self._reports = tuple(self._reports), []
        return NodeSignals(self._stall, self.expected_gpus, visible, reports)

    def _publish(self, snapshot: Snapshot) -> list[Event]:
        if self._stall is not None:
            snapshot = Snapshot(
                snapshot.ts,
                snapshot.readings,
                snapshot.health,
                snapshot.host,
                snapshot.sweep_s,
                self._stall,
            )
        events = self._health_event(snapshot.health)
        self.snapshot = snapshot
        return events

    # ---- events ------------------------------------------------------------------------------

    def _health_event(self, health: NodeHealth) -> list[Event]:
        """One event for whatever this pass changed (its XIDs, the GPUs whose verdict moved,
        the node's verdict), or none: one fault is one event, however many signals it moved."""
        xids = [self._xid(x) for x in health.xids]
        gpus = [c for g in health.gpus if (c := self._gpu_change(g)) is not None]
        now, before = (health.verdict, health.action.value), self._node_verdict
        if not xids and not gpus and now == before:
            return []
        self._node_verdict = now
        previous = before[0] if before else None
        if now != before:
            log.info(
                "node verdict %s",
                health.verdict.value,
                extra={
                    "previous": previous,
                    "action": health.action.value,
                    "reasons": "; ".join(f.detail for f in health.node_findings),
                },
            )
        payload = NodeHealthPayload(
            verdict=health.verdict,
            previous=previous,
            action=health.action,
            unhealthy_gpus=health.unhealthy_gpus,
            findings=list(health.findings),
            gpus=gpus,
            xids=xids,
        )
        return [NodeHealthEvent(source=self.source, payload=payload, ts=self.clock())]

    def _xid(self, x: XidOutcome) -> XidReport:
        self.xids.counts[(x.gpu, x.xid)] += 1
        self.xids.last[x.gpu] = x.xid
        log.warning(
            "XID %d on GPU %d: %s",
            x.xid,
            x.gpu,
            x.name,
            extra={"action": x.action.value, "repeats": x.repeats_in_window},
        )
        return XidReport(
            gpu=x.gpu,
            uuid=x.uuid,
            xid=x.xid,
            name=x.name,
            action=x.action,
            repeats_in_window=x.repeats_in_window,
        )

    def _gpu_change(self, g: GpuHealth) -> GpuVerdict | None:
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
        return GpuVerdict(
            gpu=g.gpu,
            uuid=g.uuid,
            verdict=g.verdict,
            previous=before[0] if before else None,
            action=g.action,
            findings=list(g.findings),
        )
