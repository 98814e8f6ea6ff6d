"""Training run: progress, loss and grad norm with anomaly markers, MFU per rank, step time and
its compute/communication split, stragglers and hangs, and the hooks' own health.

Source: what training ranks report through the node agent's socket (trainer hooks), re-exported
by the agent as `sentinel_rank_*` with labels node/job/rank. The agent already exports
`sentinel_rank_events_total{kind}` and `sentinel_rank_last_event_timestamp_seconds`; the per-step
values (`sentinel_rank_step`, `_loss`, `_grad_norm`, `_mfu_ratio`, `_step_seconds`,
`_compute_seconds`, `_comm_seconds`, `_tokens_per_second`, `_hook_errors_total`,
`_dropped_events_total`) are the agent's re-export of the hooks' `rank.step` event. Goodput and
checkpoint timing are not here: no process exports them as live series (`sentinel goodput` is an
offline projection), so a panel for them would stay empty.
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    GOOD_LOW,
    JSON,
    TABLE_CUSTOM,
    TABLE_TRANSFORM,
    TIMESERIES_CUSTOM,
    Dashboard,
    Query,
    prometheus_annotation,
    query_variable,
    stat_options,
    table_options,
    timeseries_options,
)

J = 'job=~"$job"'
R = 'job=~"$job", rank=~"$rank"'
ANOMALY = (
    f'sum by (job, rank) (increase(sentinel_rank_events_total{{{J}, kind="rank.anomaly"}}[2m])) > 0'
)


def build() -> JSON:
    d = Dashboard(
        uid="sentinel-training-run",
        title="Sentinel / Training run",
        description="One training job: loss and grad norm with anomaly markers, MFU per rank, "
        "step time and its compute/communication split, stragglers and hangs, hook health.",
        tags=["sentinel", "training"],
        variables=[
            query_variable(
                "job", "Job", "label_values(sentinel_rank_last_event_timestamp_seconds, job)"
            ),
            query_variable(
                "rank",
                "Rank",
                'label_values(sentinel_rank_last_event_timestamp_seconds{job=~"$job"}, rank)',
            ),
        ],
        annotations=[
            prometheus_annotation(
                "Loss/grad anomaly", ANOMALY, "orange", "anomaly on rank {{rank}} ({{job}})"
            ),
            prometheus_annotation(
                "Hang",
                f'sum by (job, rank) (increase(sentinel_rank_events_total{{{J}, kind="rank.hang"}}[2m])) > 0',
                "red",
                "hang reported by rank {{rank}} ({{job}})",
            ),
        ],
    )
    _progress(d)
    _loss(d)
    _efficiency(d)
    _stragglers(d)
    return d.to_json()


def _progress(d: Dashboard) -> None:
    d.row("Progress")
    d.add(
        "stat",
        "Step",
        "Highest step any rank reported.",
        [Query(f"max by (job) (sentinel_rank_step{{{J}}})", "{{job}}")],
        "none",
        ((None, "blue"),),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Seconds since a rank last reported",
        "A stalled or hung job stops moving this (ranks report every few steps).",
        [
            Query(
                f"time() - min by (job) (sentinel_rank_last_event_timestamp_seconds{{{J}}})",
                "{{job}}",
            )
        ],
        "s",
        ((None, "green"), (60, "orange"), (300, "red")),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Tokens per second",
        "Summed over ranks.",
        [Query(f"sum by (job) (sentinel_rank_tokens_per_second{{{J}}})", "{{job}}")],
        "short",
        ((None, "blue"),),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Ranks reporting",
        "Ranks that reported through a node agent in the last 5 minutes.",
        [
            Query(
                f"count by (job) (time() - sentinel_rank_last_event_timestamp_seconds{{{J}}} < 300)",
                "{{job}}",
            )
        ],
        "none",
        ((None, "blue"),),
        w=6,
        h=5,
        options=stat_options(),
    )


def _loss(d: Dashboard) -> None:
    d.row("Loss and gradients")
    d.add(
        "timeseries",
        "Loss",
        "Mean loss over ranks; anomaly annotations mark spikes and NaN/Inf a rank flagged.",
        [Query(f"avg by (job) (sentinel_rank_loss{{{J}}})", "{{job}}")],
        "none",
        ((None, "green"),),
        w=8,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Gradient norm",
        "Max over ranks: a spike here precedes a loss spike.",
        [Query(f"max by (job) (sentinel_rank_grad_norm{{{J}}})", "{{job}}")],
        "none",
        ((None, "green"),),
        w=8,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Anomalies reported",
        "Loss/grad-norm anomalies (spike, NaN, Inf) per rank.",
        [
            Query(
                f'sum by (job, rank) (increase(sentinel_rank_events_total{{{R}, kind="rank.anomaly"}}[$__rate_interval]))',
                "{{job}} rank {{rank}}",
            )
        ],
        "none",
        GOOD_LOW,
        w=8,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM | {"drawStyle": "bars", "fillOpacity": 80},
    )


def _efficiency(d: Dashboard) -> None:
    d.row("Throughput and efficiency")
    d.add(
        "heatmap",
        "MFU per rank",
        "Model FLOPs utilization, one row per rank: a cold row is a slow rank.",
        [Query(f"avg by (rank) (sentinel_rank_mfu_ratio{{{R}}})", "{{rank}}")],
        "percentunit",
        ((None, "red"), (0.3, "orange"), (0.4, "green")),
        w=24,
        h=9,
        options={
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "RdYlGn", "steps": 64, "exponent": 0.5},
            "yAxis": {"axisPlacement": "left", "reverse": False},
            "rowsFrame": {"layout": "auto"},
            "cellValues": {"unit": "percentunit"},
            "tooltip": {"mode": "single", "yHistogram": False},
            "legend": {"show": True},
        },
    )
    d.add(
        "timeseries",
        "Step time across ranks",
        "Median, 90th percentile and slowest rank's last step time.",
        [
            Query(f"quantile by (job) (0.5, sentinel_rank_step_seconds{{{R}}})", "{{job}} p50"),
            Query(f"quantile by (job) (0.9, sentinel_rank_step_seconds{{{R}}})", "{{job}} p90"),
            Query(f"max by (job) (sentinel_rank_step_seconds{{{R}}})", "{{job}} max"),
        ],
        "s",
        ((None, "green"),),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Compute vs communication wait",
        "Mean per-step seconds in compute and in waiting for collectives: a growing wait with "
        "flat compute points at a straggler or a slow link.",
        [
            Query(f"avg by (job) (sentinel_rank_compute_seconds{{{R}}})", "{{job}} compute"),
            Query(f"avg by (job) (sentinel_rank_comm_seconds{{{R}}})", "{{job}} comm wait"),
        ],
        "s",
        ((None, "green"),),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM | {"stacking": {"mode": "normal", "group": "A"}},
    )


def _stragglers(d: Dashboard) -> None:
    d.row("Stragglers, hangs, checkpoints")
    d.add(
        "table",
        "Slowest ranks (compute over the job median)",
        "Each rank's compute time over its job's median; 1.2 means 20% slower than its peers.",
        [
            Query(
                f"topk(8, sentinel_rank_compute_seconds{{{R}}} / on (job) group_left "
                f"quantile by (job) (0.5, sentinel_rank_compute_seconds{{{J}}}))",
                instant=True,
                table=True,
            )
        ],
        "percentunit",
        ((None, "green"), (1.1, "orange"), (1.25, "red")),
        w=8,
        options=table_options(),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.add(
        "table",
        "Straggler, hang and SDC reports (last hour)",
        "Events the hooks raised per rank: rank.straggler (persistent slowdown), rank.hang "
        "(watchdog), rank.sdc (spot-check digest).",
        [
            Query(
                f'sum by (job, node, rank, kind) (increase(sentinel_rank_events_total{{{R}, kind=~"rank.straggler|rank.hang|rank.sdc"}}[1h])) > 0',
                instant=True,
                table=True,
            )
        ],
        "none",
        GOOD_LOW,
        w=8,
        options=table_options(),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.add(
        "timeseries",
        "Hook errors and dropped events",
        "Errors the trainer hooks caught (and swallowed) and events a rank could not send to "
        "its node agent: non-zero means the panels above miss data, not that training failed.",
        [
            Query(f"sum by (job) (sentinel_rank_hook_errors_total{{{J}}})", "{{job}} hook errors"),
            Query(
                f"sum by (job) (sentinel_rank_dropped_events_total{{{J}}})",
                "{{job}} dropped events",
            ),
        ],
        "none",
        GOOD_LOW,
        w=8,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
