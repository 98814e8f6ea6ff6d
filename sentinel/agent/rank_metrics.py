"""Re-export of what training ranks report, so one scrape of a node shows its ranks too."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sentinel.protocol import Event


class RankMetrics:
    def __init__(self) -> None:
        self.events: Counter[tuple[str, int, str]] = Counter()  # (job, rank, kind) -> n
        self.last_seen: dict[tuple[str, int], float] = {}

    def observe(self, event: Event) -> None:
        src = event.source
        if src.rank is None:
            return
        key = (src.job or "", src.rank)
        self.events[(*key, event.kind.value)] += 1
        self.last_seen[key] = max(event.ts, self.last_seen.get(key, 0.0))

    def collect(self, node_id: str) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "sentinel_rank_events",
            "Events relayed from each rank, by kind.",
            labels=["node", "job", "rank", "kind"],
        )
        for (job, rank, kind), n in sorted(self.events.items()):
            events.add_metric([node_id, job, str(rank), kind], n)
        last = GaugeMetricFamily(
            "sentinel_rank_last_event_timestamp_seconds",
            "When each rank last reported (a stalled rank stops moving this).",
            labels=["node", "job", "rank"],
        )
        for (job, rank), ts in sorted(self.last_seen.items()):
            last.add_metric([node_id, job, str(rank)], ts)
        yield events
        yield last
