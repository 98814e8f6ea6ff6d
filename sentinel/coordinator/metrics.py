"""The coordinator's Prometheus metrics: ingest counters plus gauges read from the store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from sentinel.coordinator.incidents import IncidentState
from sentinel.coordinator.ingest import IngestResult

if TYPE_CHECKING:
    from sentinel.coordinator.service import Service


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        p = "sentinel_coordinator_"
        self.events = Counter(f"{p}events", "events ingested", ["result"], registry=r)
        self.batches = Counter(f"{p}batches", "event batches acknowledged", registry=r)
        self.rejected = Counter(f"{p}rejected_batches", "batches refused", ["code"], registry=r)
        self.ack_seconds = Histogram(
            f"{p}ack_seconds",
            "from parsed batch to durable ack",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.incidents = Gauge(f"{p}incidents", "incidents by state", ["state"], registry=r)
        self.actions = Gauge(f"{p}actions", "playbook actions by state", ["state"], registry=r)
        self.nodes = Gauge(f"{p}nodes", "known nodes by state", ["state"], registry=r)
        self.jobs = Gauge(f"{p}jobs", "jobs by state", ["state"], registry=r)
        self.budget = Gauge(
            f"{p}eviction_budget_remaining",
            "evictions still allowed in the current window",
            registry=r,
        )

    def count_ingest(self, result: IngestResult) -> None:
        self.events.labels(result="accepted").inc(result.accepted)
        self.events.labels(result="duplicate").inc(result.duplicates)

    def observe_batch(self, result: IngestResult, seconds: float) -> None:
        self.batches.inc()
        self.ack_seconds.observe(seconds)

    def render(self, service: Service) -> bytes:
        store, now = service.store, service.clock()
        for gauge in (self.incidents, self.actions, self.nodes, self.jobs):
            gauge.clear()  # a state nothing is in any more reads 0, not its last value
        for state in IncidentState:
            self.incidents.labels(state=state).set(0)
        for table, gauge, col in (
            ("incidents", self.incidents, "state"),
            ("actions", self.actions, "state"),
            ("nodes", self.nodes, "state"),
            ("jobs", self.jobs, "state"),
        ):
            for row in store.query(f"SELECT {col} AS s, COUNT(*) AS n FROM {table} GROUP BY {col}"):
                gauge.labels(state=row["s"]).set(row["n"])
        budget = service.cfg.eviction
        evicted = store.one(
            "SELECT COUNT(*) AS n FROM nodes WHERE state='evicted' AND state_changed_at>=?",
            (now - budget.window_s,),
        )
        spent = int(evicted["n"]) if evicted else 0
        self.budget.set(max(0, budget.max_per_window - spent))
        return generate_latest(self.registry)
