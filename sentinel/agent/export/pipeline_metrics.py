"""Metrics about the agent's own plumbing: event delivery, spool, the rank socket."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sentinel.agent.nvml.readings import GpuBackend
from sentinel.agent.ranks.listener import RankSocketServer
from sentinel.agent.uplink.delivery import Deliverer
from sentinel.agent.uplink.spool import Spool


def delivery_families(spool: Spool, deliverer: Deliverer) -> Iterator[Metric]:
    stats = deliverer.stats
    yield GaugeMetricFamily(
        "sentinel_agent_spooled_events", "Events on disk awaiting delivery.", value=len(spool)
    )
    yield CounterMetricFamily(
        "sentinel_agent_spool_dropped_events",
        "Oldest events dropped because the spool was full.",
        value=spool.dropped,
    )
    yield CounterMetricFamily(
        "sentinel_agent_delivered_events",
        "Events acknowledged by the coordinator.",
        value=stats.delivered,
    )
    yield CounterMetricFamily(
        "sentinel_agent_rejected_events",
        "Events the coordinator refused as malformed.",
        value=stats.rejected,
    )
    yield CounterMetricFamily(
        "sentinel_agent_delivery_failures",
        "Delivery attempts that failed (retried).",
        value=stats.failures,
    )
    coordinators = deliverer.coordinators
    yield CounterMetricFamily(
        "sentinel_agent_coordinator_failovers",
        "Moves from a coordinator URL that did not answer to the next one listed.",
        value=coordinators.failovers,
    )
    current = GaugeMetricFamily(
        "sentinel_agent_coordinator_current",
        "1 for the coordinator URL the agent talks to now.",
        labels=["url"],
    )
    current.add_metric([coordinators.current], 1)
    yield current


def rank_socket_families(server: RankSocketServer) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "sentinel_agent_rank_messages",
        "Valid events received from training ranks.",
        value=server.received,
    )
    yield CounterMetricFamily(
        "sentinel_agent_rank_garbage_lines",
        "Lines from ranks dropped as invalid.",
        value=server.garbage,
    )


def backend_error_families(backend: GpuBackend) -> Iterator[Metric]:
    fam = CounterMetricFamily(
        "sentinel_agent_field_read_errors",
        "GPU field reads that failed (and are retried), by field.",
        labels=["field"],
    )
    for name, n in sorted(backend.field_errors().items()):
        fam.add_metric([name], n)
    yield fam
