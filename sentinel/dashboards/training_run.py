"""Training run: progress, loss and grad norm with anomaly markers, MFU per rank, step time and
its compute/communication split, stragglers and hangs, and the hooks' own health.

Source: what training ranks report through the node agent's socket (trainer hooks), re-exported
by the agent as `sentinel_rank_*` with labels node/job/rank. The agent already exports
`sentinel_rank_events_total{kind}` and `sentinel_rank_last_event_timestamp_seconds`; the per-step
values (`sentinel_rank_step`, `_loss`, `_grad_norm`, `_mfu_ratio`, `_step_seconds`,
`_compute_seconds`, `_comm_seconds`, `_tokens_per_second`, `_hook_errors_total`,
`_dropped_events_total`) are the agent's re-export of the hooks' `rank.step` event. Goodput, restarts and
steps lost to rollbacks are derived from `sentinel_rank_step` (a restart resumes from a checkpoint,
so the step drops). The checkpoint panels read `sentinel_rank_last_checkpoint_step`,
`_timestamp_seconds` and `_blocked_seconds`, the agent's re-export of the hooks' `rank.checkpoint`
(sent by the rank that commits a checkpoint). The job selector and the "GPUs of this job" row read the agent's info series
`sentinel_gpu_job_info{node,gpu,job,rank,tp,pp,dp}`, joined to the per-GPU series on (node, gpu).
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    BARS,
    BLUE,
    GOOD_LOW,
    STACKED,
    THRESHOLD_LINES,
    Panel,
    Query,
    Row,
    Spec,
    prometheus_annotation,
    query_variable,
    table_options,
)

J = 'job=~"$job"'
# The agent's info series says which job, rank and parallel coordinates each GPU serves:
# multiplying a per-GPU series by it keeps the GPUs of the selected job and labels them.
JOB_GPUS = 'on (node, gpu) group_left (job, rank, tp, pp, dp) sentinel_gpu_job_info{job=~"$job", rank=~"$rank"}'
STEP = f"max by (job) (sentinel_rank_step{{{J}}})"
CKPT = "sentinel_rank_last_checkpoint"  # the hooks' rank.checkpoint, re-exported by the agent
WINDOW_S = 600

PANELS: list[Row | Panel] = [
    Row("Progress"),
    Panel(
        "stat",
        "Step",
        "Highest step any rank reported.",
        [Query('max by (job) (sentinel_rank_step{job=~"$job"})', "{{job}}")],
        steps=BLUE,
        w=6,
        h=5,
    ),
    Panel(
        "stat",
        "Seconds since a rank last reported",
        "A stalled or hung job stops moving this (ranks report every few steps).",
        [
            Query(
                'time() - min by (job) (sentinel_rank_last_event_timestamp_seconds{job=~"$job"})',
                "{{job}}",
            )
        ],
        unit="s",
        steps=((None, "green"), (60, "orange"), (300, "red")),
        w=6,
        h=5,
    ),
    Panel(
        "stat",
        "Tokens per second",
        "Summed over ranks.",
        [Query('sum by (job) (sentinel_rank_tokens_per_second{job=~"$job"})', "{{job}}")],
        unit="short",
        steps=BLUE,
        w=6,
        h=5,
    ),
    Panel(
        "stat",
        "Ranks reporting",
        "Ranks that reported through a node agent in the last 5 minutes.",
        [
            Query(
                'count by (job) (time() - sentinel_rank_last_event_timestamp_seconds{job=~"$job"} < 300)',
                "{{job}}",
            )
        ],
        steps=BLUE,
        w=6,
        h=5,
    ),
    Panel(
        "stat",
        "Goodput (last 10 minutes)",
        "Net steps made in the last 10 minutes times the mean step time, over 10 minutes: 1.0 "
        "when every second went into new steps; stalls, restarts and steps replayed after a "
        "rollback lower it.",
        [
            Query(
                f"clamp(max by (job) (delta(sentinel_rank_step{{{J}}}[{WINDOW_S}s]))"
                f" * avg by (job) (sentinel_rank_step_seconds{{{J}}}) / {WINDOW_S}, 0, 1)",
                "{{job}}",
            )
        ],
        unit="percentunit",
        steps=((None, "red"), (0.8, "orange"), (0.95, "green")),
        w=12,
        h=5,
        min=0,
        max=1,
    ),
    Panel(
        "stat",
        "Restarts from a checkpoint (time range)",
        "Times the job went back to an earlier step: each restart resumes from its last "
        "checkpoint, so the step ranks report drops.",
        [Query(f"max by (job) (resets(sentinel_rank_step{{{J}}}[$__range]))", "{{job}}")],
        steps=((None, "green"), (1, "orange"), (3, "red")),
        w=12,
        h=5,
    ),
    Row("Loss and gradients"),
    Panel(
        "timeseries",
        "Loss",
        "Mean loss over ranks; anomaly annotations mark spikes and NaN/Inf a rank flagged.",
        [Query('avg by (job) (sentinel_rank_loss{job=~"$job"})', "{{job}}")],
        w=8,
    ),
    Panel(
        "timeseries",
        "Gradient norm",
        "Max over ranks: a spike here precedes a loss spike.",
        [Query('max by (job) (sentinel_rank_grad_norm{job=~"$job"})', "{{job}}")],
        w=8,
    ),
    Panel(
        "timeseries",
        "Anomalies reported",
        "Loss/grad-norm anomalies (spike, NaN, Inf) per rank.",
        [
            Query(
                'sum by (job, rank) (increase(sentinel_rank_events_total{job=~"$job", rank=~"$rank", kind="rank.anomaly"}[$__rate_interval]))',
                "{{job}} rank {{rank}}",
            )
        ],
        steps=GOOD_LOW,
        w=8,
        custom=BARS,
    ),
    Row("Throughput and efficiency"),
    Panel(
        "heatmap",
        "MFU per rank",
        "Model FLOPs utilization, one row per rank: a cold row is a slow rank.",
        [Query('avg by (rank) (sentinel_rank_mfu_ratio{job=~"$job", rank=~"$rank"})', "{{rank}}")],
        unit="percentunit",
        steps=((None, "red"), (0.3, "orange"), (0.4, "green")),
        w=24,
        h=9,
        options={
            "calculate": False,
            "cellGap": 1,
            "cellValues": {"unit": "percentunit"},
            "color": {"exponent": 0.5, "mode": "scheme", "scheme": "RdYlGn", "steps": 64},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": False},
            "yAxis": {"axisPlacement": "left", "reverse": False},
        },
    ),
    Panel(
        "timeseries",
        "Step time across ranks",
        "Median, 90th percentile and slowest rank's last step time.",
        [
            Query(
                'quantile by (job) (0.5, sentinel_rank_step_seconds{job=~"$job", rank=~"$rank"})',
                "{{job}} p50",
            ),
            Query(
                'quantile by (job) (0.9, sentinel_rank_step_seconds{job=~"$job", rank=~"$rank"})',
                "{{job}} p90",
            ),
            Query(
                'max by (job) (sentinel_rank_step_seconds{job=~"$job", rank=~"$rank"})',
                "{{job}} max",
            ),
        ],
        unit="s",
    ),
    Panel(
        "timeseries",
        "Compute vs communication wait",
        "Mean per-step seconds in compute and in waiting for collectives: a growing wait with flat compute points at a straggler or a slow link.",
        [
            Query(
                'avg by (job) (sentinel_rank_compute_seconds{job=~"$job", rank=~"$rank"})',
                "{{job}} compute",
            ),
            Query(
                'avg by (job) (sentinel_rank_comm_seconds{job=~"$job", rank=~"$rank"})',
                "{{job}} comm wait",
            ),
        ],
        unit="s",
        custom=STACKED,
    ),
    Row("Stragglers, hangs, checkpoints"),
    Panel(
        "timeseries",
        "Steps lost to rollbacks",
        "How far the job is behind the furthest step it reached in the last hour: a rollback "
        "to a checkpoint jumps it to the steps done since that checkpoint, then it falls to 0 "
        "as the job replays them. A high jump means checkpoints too far apart.",
        [Query(f"max by (job) (max_over_time(sentinel_rank_step{{{J}}}[1h])) - {STEP}", "{{job}}")],
        steps=((None, "green"), (1, "orange")),
        w=24,
    ),
    Panel(
        "timeseries",
        "Steps since the last checkpoint",
        "Steps a restart now would replay: the job's step minus the step of its last complete "
        "(committed) checkpoint. A saw-tooth whose peaks pass the checkpoint interval means "
        "saves are failing or late.",
        [Query(f"clamp_min({STEP} - max by (job) ({CKPT}_step{{{J}}}), 0)", "{{job}}")],
        steps=((None, "green"),),
        w=8,
    ),
    Panel(
        "stat",
        "Time since the last checkpoint",
        "Wall time since the job last reported a checkpoint complete: the work a failure now "
        "would lose, in seconds.",
        [Query(f"time() - max by (job) ({CKPT}_timestamp_seconds{{{J}}})", "{{job}}")],
        unit="s",
        steps=((None, "green"), (3600, "orange"), (7200, "red")),
        w=8,
    ),
    Panel(
        "timeseries",
        "Training time held up by the last checkpoint",
        "Seconds the last save blocked training (starting it and waiting for its staging "
        "copy); an asynchronous save should cost a fraction of a step.",
        [Query(f"max by (job) ({CKPT}_blocked_seconds{{{J}}})", "{{job}}")],
        unit="s",
        steps=GOOD_LOW,
        w=8,
    ),
    Panel(
        "table",
        "Slowest ranks (compute over the job median)",
        "Each rank's compute time over its job's median; 1.2 means 20% slower than its peers.",
        [
            Query(
                'topk(8, sentinel_rank_compute_seconds{job=~"$job", rank=~"$rank"} / on (job) group_left quantile by (job) (0.5, sentinel_rank_compute_seconds{job=~"$job"}))',
                instant=True,
                table=True,
            )
        ],
        unit="percentunit",
        steps=((None, "green"), (1.1, "orange"), (1.25, "red")),
        w=8,
    ),
    Panel(
        "table",
        "Straggler, hang and SDC reports (last hour)",
        "Events the hooks raised per rank: rank.straggler (persistent slowdown), rank.hang (watchdog), rank.sdc (spot-check digest).",
        [
            Query(
                'sum by (job, node, rank, kind) (increase(sentinel_rank_events_total{job=~"$job", rank=~"$rank", kind=~"rank.straggler|rank.hang|rank.sdc"}[1h])) > 0',
                instant=True,
                table=True,
            )
        ],
        steps=GOOD_LOW,
        w=8,
    ),
    Panel(
        "timeseries",
        "Hook errors and dropped events",
        "Errors the trainer hooks caught (and swallowed) and events a rank could not send to its node agent: non-zero means the panels above miss data, not that training failed.",
        [
            Query(
                'sum by (job) (sentinel_rank_hook_errors_total{job=~"$job"})', "{{job}} hook errors"
            ),
            Query(
                'sum by (job) (sentinel_rank_dropped_events_total{job=~"$job"})',
                "{{job}} dropped events",
            ),
        ],
        steps=GOOD_LOW,
        w=8,
    ),
    Row("GPUs of this job"),
    Panel(
        "table",
        "Job layout",
        "Each rank's node, GPU and place in the tensor (tp), pipeline (pp) and data (dp) "
        "parallel groups, from the agent's sentinel_gpu_job_info.",
        [Query('sentinel_gpu_job_info{job=~"$job", rank=~"$rank"}', instant=True, table=True)],
        steps=BLUE,
        w=8,
        options=table_options("rank"),
    ),
    Panel(
        "table",
        "Unhealthy GPUs serving this job",
        "GPUs of the job the agent judges degraded or unhealthy, with the rank and parallel "
        "groups they hold up.",
        [
            Query(
                '(sentinel_gpu_health_verdict{verdict=~"degraded|unhealthy"} == 1) * ' + JOB_GPUS,
                instant=True,
                table=True,
            )
        ],
        steps=((None, "orange"),),
        w=16,
        options=table_options("rank"),
    ),
    Panel(
        "timeseries",
        "Least busy GPUs of this job",
        "The 10 GPUs of the job with the lowest utilization, and the job's mean: one low line is "
        "a rank the others wait for.",
        [
            Query(f"bottomk(10, sentinel_gpu_utilization_ratio * {JOB_GPUS})", "rank {{rank}}"),
            Query(f"avg by (job) (sentinel_gpu_utilization_ratio * {JOB_GPUS})", "{{job}} mean"),
        ],
        unit="percentunit",
        min=0,
        max=1,
    ),
    Panel(
        "timeseries",
        "Hottest GPUs of this job",
        "The 10 GPUs of the job with the highest core temperature (degraded at 85 °C).",
        [Query(f"topk(10, sentinel_gpu_temperature_celsius * {JOB_GPUS})", "rank {{rank}}")],
        unit="celsius",
        steps=((None, "green"), (85, "orange"), (92, "red")),
        custom=THRESHOLD_LINES,
    ),
]

SPEC = Spec(
    uid="sentinel-training-run",
    title="Sentinel / Training run",
    description="One training job: goodput and restarts, loss and grad norm with anomaly "
    "markers, MFU per rank, step time and its compute/communication split, stragglers, hangs, "
    "steps lost to rollbacks, checkpoints, hook health, and the GPUs the job runs on.",
    tags=["sentinel", "training"],
    panels=PANELS,
    variables=[
        query_variable("job", "Job", "label_values(sentinel_gpu_job_info, job)"),
        query_variable(
            "rank",
            "Rank",
            'label_values(sentinel_rank_last_event_timestamp_seconds{job=~"$job"}, rank)',
        ),
    ],
    annotations=[
        prometheus_annotation(
            "Loss/grad anomaly",
            'sum by (job, rank) (increase(sentinel_rank_events_total{job=~"$job", kind="rank.anomaly"}[2m])) > 0',
            "orange",
            "anomaly on rank {{rank}} ({{job}})",
        ),
        prometheus_annotation(
            "Hang",
            'sum by (job, rank) (increase(sentinel_rank_events_total{job=~"$job", kind="rank.hang"}[2m])) > 0',
            "red",
            "hang reported by rank {{rank}} ({{job}})",
        ),
    ],
)
