"""Re-export of what training ranks report, so one scrape of a node shows its ranks too."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sentinel.protocol import (
    Event,
    RankCheckpointEvent,
    RankCheckpointPayload,
    RankStepEvent,
    RankStepPayload,
)

# rank.step payload field -> (metric, help, scale to base units, counter?)
STEP_SERIES = (
    ("step", "sentinel_rank_step", "Last step the rank reported.", 1.0, False),
    ("loss", "sentinel_rank_loss", "Training loss at the last reported step.", 1.0, False),
    ("grad_norm", "sentinel_rank_grad_norm", "Gradient norm at the last reported step.", 1.0,
     False),
    ("mfu", "sentinel_rank_mfu_ratio", "Model FLOPs utilization (0..1).", 1.0, False),
    ("step_s", "sentinel_rank_step_seconds", "Step wall time.", 1.0, False),
    ("compute_s", "sentinel_rank_compute_seconds", "Step time spent computing.", 1.0, False),
    ("comm_s", "sentinel_rank_comm_seconds", "Step time spent waiting on communication.", 1.0,
     False),
    ("tokens_per_s", "sentinel_rank_tokens_per_second", "Tokens processed per second.", 1.0,
     False),
    ("tflops", "sentinel_rank_flops_per_second", "Achieved model FLOP/s.", 1e12, False),
    ("mem_bytes", "sentinel_rank_memory_bytes", "Device memory allocated.", 1.0, False),
    ("hook_errors", "sentinel_rank_hook_errors", "Errors the hooks caught and swallowed.", 1.0,
     True),
    ("dropped_events", "sentinel_rank_dropped_events", "Events the rank could not send.", 1.0,
     True),
)  # fmt: skip

# rank.checkpoint payload field -> (metric, help): the last checkpoint a rank reported complete.
CHECKPOINT_SERIES = (
    ("step", "sentinel_rank_last_checkpoint_step",
     "Step of the last checkpoint the rank reported complete (resumable)."),
    ("ts", "sentinel_rank_last_checkpoint_timestamp_seconds",
     "When the rank reported its last checkpoint complete."),
    ("blocked_s", "sentinel_rank_last_checkpoint_blocked_seconds",
     "Seconds the last checkpoint held up training (starting the save, waiting for its copy)."),
)  # fmt: skip


# Kinds the alert rules count with increase(): each rank's counter starts at 0 for them, so its
# first report is an increase Prometheus sees (a series born at 1 shows none).
ALERTED_KINDS = ("rank.anomaly", "rank.hang", "rank.sdc", "rank.straggler")


class RankMetrics:
    def __init__(self) -> None:
        self.events: Counter[tuple[str, int, str]] = Counter()  # (job, rank, kind) -> n
        self.last_seen: dict[tuple[str, int], float] = {}
        self.last_step: dict[tuple[str, int], RankStepPayload] = {}
        # The last rank.checkpoint payload, with the event's time.
        self.last_checkpoint: dict[tuple[str, int], tuple[RankCheckpointPayload, float]] = {}

    def observe(self, event: Event) -> None:
        src = event.source
        if src.rank is None:
            return
        key = (src.job or "", src.rank)
        self.events[(*key, event.kind.value)] += 1
        self.last_seen[key] = max(event.ts, self.last_seen.get(key, 0.0))
        if isinstance(event, RankStepEvent):
            self.last_step[key] = event.payload
        elif isinstance(event, RankCheckpointEvent):
            self.last_checkpoint[key] = (event.payload, event.ts)

    def collect(self, node_id: str) -> Iterator[Metric]:
        labels = ["node", "job", "rank"]
        events = CounterMetricFamily(
            "sentinel_rank_events",
            "Events relayed from each rank, by kind.",
            labels=[*labels, "kind"],
        )
        counts = dict(self.events)
        for job, rank in self.last_seen:
            for kind in ALERTED_KINDS:
                counts.setdefault((job, rank, kind), 0)
        for (job, rank, kind), n in sorted(counts.items()):
            events.add_metric([node_id, job, str(rank), kind], n)
        last = GaugeMetricFamily(
            "sentinel_rank_last_event_timestamp_seconds",
            "When each rank last reported (a stalled rank stops moving this).",
            labels=labels,
        )
        for (job, rank), ts in sorted(self.last_seen.items()):
            last.add_metric([node_id, job, str(rank)], ts)
        yield events
        yield last
        for field, name, help_, scale, counter in STEP_SERIES:
            family = CounterMetricFamily if counter else GaugeMetricFamily
            steps = {key: getattr(p, field) for key, p in self.last_step.items()}
            yield _per_rank(family(name, help_, labels=labels), steps, node_id, scale)
        for field, name, help_ in CHECKPOINT_SERIES:
            saves = {
                key: ts if field == "ts" else getattr(p, field)
                for key, (p, ts) in self.last_checkpoint.items()
            }
            yield _per_rank(GaugeMetricFamily(name, help_, labels=labels), saves, node_id)


def _per_rank(
    fam: GaugeMetricFamily | CounterMetricFamily,
    values: dict[tuple[str, int], object],
    node_id: str,
    scale: float = 1.0,
) -> Metric:
    """One sample per rank from the field of its last payload (a null field: none)."""
    for (job, rank), value in sorted(values.items()):
        if isinstance(value, int | float):  # null: the rank cannot measure it
            fam.add_metric([node_id, job, str(rank)], float(value) * scale)
    return fam
