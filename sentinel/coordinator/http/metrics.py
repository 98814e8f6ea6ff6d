"""The coordinator's Prometheus metrics: ingest counters plus gauges read from the store."""

from __future__ import annotations

import gc
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from sentinel.coordinator.core.ingest import IngestResult
from sentinel.coordinator.core.stages import launch_stage_seconds
from sentinel.coordinator.core.states import OUT_OF_SERVICE, RECOVERED, Entity, IncidentState

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sentinel.coordinator.runtime import Service
    from sentinel.coordinator.store.sql import SqlStore

# Time to detect (first signal to incident) and to recover (incident to mitigated/resolved).
INCIDENT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)


# A repair's stages, from deciding to act to each step done (a drain, a relaunch), and the
# relaunch's own (rendezvous, checkpoint load, the restart to its first step).
STAGE_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


def histogram(
    name: str,
    help_: str,
    values: list[float],
    buckets: tuple[float, ...] = INCIDENT_BUCKETS,
) -> HistogramMetricFamily:
    return labelled_histogram(name, help_, [], {(): values}, buckets)


def labelled_histogram(
    name: str,
    help_: str,
    labels: list[str],
    series: dict[tuple[str, ...], list[float]],
    buckets: tuple[float, ...],
) -> HistogramMetricFamily:
    """A histogram family built at scrape time: one series per label values."""
    fam = HistogramMetricFamily(name, help_, labels=labels)
    for key, values in sorted(series.items()):
        cumulative = [(str(b), float(sum(v <= b for v in values))) for b in buckets]
        fam.add_metric(
            list(key), [*cumulative, ("+Inf", float(len(values)))], sum_value=sum(values)
        )
    return fam


class IncidentHistory:
    """Counters and histograms over every incident the store holds, read at scrape time: they
    survive a coordinator restart, as the store does (incidents are never deleted)."""

    def __init__(self) -> None:
        self.store: SqlStore | None = None
        self.stages: set[tuple[str, str]] = set()  # (playbook, stage) shown even when unseen
        self.targets: dict[tuple[str, str], float] = {}  # playbooks' `stage_targets_s`

    def collect(self) -> Iterator[Metric]:
        if self.store is None:
            return
        p = "sentinel_coordinator_"
        opened = CounterMetricFamily(
            f"{p}incidents_opened", "incidents opened, by fault kind", labels=["kind"]
        )
        for fault, n in self.store.fault_counts().items():
            opened.add_metric([fault], n)
        yield opened
        detect = [max(0.0, d) for d in self.store.detect_seconds()]
        yield histogram(
            f"{p}incident_detect_seconds", "from an incident's first event to its opening", detect
        )
        recover = [max(0.0, d) for d in self.store.recover_seconds(RECOVERED)]
        yield histogram(
            f"{p}incident_recover_seconds",
            "from an incident's opening to it being mitigated or resolved",
            recover,
        )
        yield from self._playbooks(p)
        stages: dict[tuple[str, ...], list[float]] = {key: [] for key in self.stages}
        for book, stage, seconds in self.store.stage_seconds():
            stages.setdefault((book, stage), []).append(max(0.0, seconds))
        for row in self.store.repair_stages():
            for stage, seconds in launch_stage_seconds(row).items():
                stages.setdefault((row.playbook, stage), []).append(seconds)
        for book, seconds in self.store.bundle_seconds():
            stages.setdefault((book, "bundle"), []).append(max(0.0, seconds))
        yield labelled_histogram(
            f"{p}repair_stage_seconds",
            "a repair's stages per playbook: decide (run created to its first step), then each"
            " step by its action (evidence: the ranks' capture; evict_node: the drain; resume:"
            " until the new gang runs), bundle (the capture begun to the evidence bundle sealed),"
            " then"
            " the new gang's rendezvous and checkpoint_load, and first_step (the restart"
            " ordered to the new gang's first step done)",
            ["playbook", "stage"],
            stages,
            STAGE_BUCKETS,
        )
        yield from self._targets(p, stages)

    def _targets(self, p: str, stages: dict[tuple[str, ...], list[float]]) -> Iterator[Metric]:
        """The playbooks' stage targets, and the repairs whose stage took longer: an alert
        reads the count, whatever target each playbook set."""
        target = GaugeMetricFamily(
            f"{p}repair_stage_target_seconds",
            "a playbook's target for one of its repair's stages (stage_targets_s)",
            labels=["playbook", "stage"],
        )
        over = CounterMetricFamily(
            f"{p}repair_stage_over_target",
            "repairs whose stage took longer than its playbook's target",
            labels=["playbook", "stage"],
        )
        for key, seconds in sorted(self.targets.items()):
            target.add_metric(list(key), seconds)
            over.add_metric(list(key), sum(v > seconds for v in stages.get(key, [])))
        yield target
        yield over

    def _playbooks(self, p: str) -> Iterator[Metric]:
        """Runs per playbook, live and shadow (dry run), by status; and the steps shadow runs
        would have taken: what an operator reads before switching a playbook on."""
        assert self.store is not None
        runs = CounterMetricFamily(
            f"{p}playbook_runs",
            "playbook runs by playbook, mode (live or shadow: a dry run that acts on nothing)"
            " and status",
            labels=["playbook", "mode", "status"],
        )
        for book, dry, status, n in self.store.run_counts():
            runs.add_metric([book, "shadow" if dry else "live", status], n)
        yield runs
        would = CounterMetricFamily(
            f"{p}shadow_actions",
            "steps shadow runs decided and recorded but did not carry out, by playbook and action",
            labels=["playbook", "action"],
        )
        for book, action, n in self.store.shadow_action_counts():
            would.add_metric([book, action], n)
        yield would


GC_PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class GcPauses:
    """How long Python's cyclic collector stopped the coordinator, by generation: a full pass
    over a large heap stalls every acknowledgement behind it.

    Counted from `gc.callbacks` into plain lists, exported at scrape time: a collection can start
    inside any allocation, including one made while a prometheus_client metric holds its lock.
    """

    def __init__(self) -> None:
        self._started = 0.0
        self._buckets = [[0] * len(GC_PAUSE_BUCKETS) for _ in range(3)]
        self._count = [0, 0, 0]
        self._sum = [0.0, 0.0, 0.0]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause, gen = time.perf_counter() - self._started, info["generation"]
        self._count[gen] += 1
        self._sum[gen] += pause
        buckets = self._buckets[gen]
        for i, bound in enumerate(GC_PAUSE_BUCKETS):
            if pause <= bound:
                buckets[i] += 1

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(
            "sentinel_coordinator_gc_pause_seconds",
            "pauses of Python's cyclic garbage collector in the coordinator, by generation",
            labels=["generation"],
        )
        for gen in range(3):
            cumulative = [
                (str(b), float(n))
                for b, n in zip(GC_PAUSE_BUCKETS, self._buckets[gen], strict=True)
            ]
            fam.add_metric(
                [str(gen)],
                [*cumulative, ("+Inf", float(self._count[gen]))],
                sum_value=self._sum[gen],
            )
        yield fam


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        p = "sentinel_coordinator_"
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        self.events = counter(f"{p}events", "events ingested", ["result"])
        # Children looked up once: every acknowledged batch counts into them.
        self._accepted = self.events.labels(result="accepted")
        self._duplicates = self.events.labels(result="duplicate")
        self.batches = counter(f"{p}batches", "event batches acknowledged")
        self.rejected = counter(f"{p}rejected_batches", "batches refused", ["code"])
        kept = "events an incident holds are kept"
        self.pruned = counter(f"{p}events_pruned", f"events deleted past the retention ({kept})")
        self.ack_seconds = Histogram(
            f"{p}ack_seconds",
            "from a received batch to its durable ack (decoding, checks and commit)",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.incidents = gauge(f"{p}incidents", "incidents by state", ["state"])
        self.actions = gauge(f"{p}actions", "playbook actions by state", ["state"])
        self.nodes = gauge(f"{p}nodes", "known nodes by state", ["state"])
        self.jobs = gauge(f"{p}jobs", "jobs by state", ["state"])
        self.budget = gauge(
            f"{p}eviction_budget_remaining", "evictions still allowed in the current window"
        )
        files = "SQLite's database and write-ahead log, or the PostgreSQL database"
        self.store_bytes = gauge(f"{p}store_bytes", f"size of the store: {files}", ["file"])
        self.leader = gauge(f"{p}leader", "1 on the replica that runs the engine, else 0")
        self.epoch = gauge(
            f"{p}leader_epoch", "the leadership epoch this replica leads at (0: follows)"
        )
        said = "the scheduler bridge's last poll of every node's state"
        self.scheduler_up = gauge(
            f"{p}scheduler_up", f"1 when {said} read the scheduler, 0 when it failed", ["scheduler"]
        )
        self.scheduler_failed = counter(
            f"{p}scheduler_poll_failures", "polls of the scheduler that failed", ["scheduler"]
        )
        self._scheduler_failures = 0
        self.history = IncidentHistory()
        r.register(self.history)
        self.gc_pauses = GcPauses()
        r.register(self.gc_pauses)

    def close(self) -> None:
        self.gc_pauses.close()

    def count_ingest(self, accepted: int, duplicates: int) -> None:
        self._accepted.inc(accepted)
        self._duplicates.inc(duplicates)

    def observe_batch(self, result: IngestResult, seconds: float) -> None:
        self.batches.inc()
        self.ack_seconds.observe(seconds)

    def render(self, service: Service) -> bytes:
        store, now = service.store, service.clock()
        epoch = service.leadership.epoch
        self.leader.set(0 if epoch is None else 1)
        self.epoch.set(epoch or 0)
        self.history.store = store
        # Every playbook's stages are series from the start (at 0), so an alert's increase()
        # sees a first slow repair, and a rule reading a stage never reads a missing series.
        self.history.stages = {
            (b.name, stage) for b in service.playbooks for stage in b.all_stages()
        }
        self.history.targets = {
            (b.name, stage): seconds
            for b in service.playbooks
            for stage, seconds in b.stage_targets_s.items()
        }
        for gauge in (self.incidents, self.actions, self.nodes, self.jobs):
            gauge.clear()  # a state nothing is in any more reads 0, not its last value
        for state in IncidentState:
            self.incidents.labels(state=state).set(0)
        for entity, gauge in (
            (Entity.INCIDENT, self.incidents),
            (Entity.STEP, self.actions),
            (Entity.NODE, self.nodes),
            (Entity.JOB, self.jobs),
        ):
            for name, n in store.state_counts(entity).items():
                gauge.labels(state=name).set(n)
        budget = service.cfg.eviction
        spent = store.count_nodes(OUT_OF_SERVICE, changed_since=now - budget.window_s)
        self.budget.set(max(0, budget.max_per_window - spent))
        if service.scheduler_up is not None:  # this replica polls (or polled) a scheduler
            name = service.engine.effects.backend.name
            self.scheduler_up.labels(scheduler=name).set(1 if service.scheduler_up else 0)
            failed = service.scheduler_failures - self._scheduler_failures
            self.scheduler_failed.labels(scheduler=name).inc(failed)
            self._scheduler_failures = service.scheduler_failures
        for file, size in store.file_sizes().items():
            self.store_bytes.labels(file=file).set(size)
        return generate_latest(self.registry)
