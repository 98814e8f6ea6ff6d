"""Burn-in: the gang test before a job gets the fleet.

Source: the burn-in report (`sentinel burnin --json`) turned into `sentinel_burnin_*` series by
`sentinel dashboards burnin-textfile` for node_exporter's textfile collector
(`sentinel/dashboards/burnin_metrics.py`): one series per link (`a`, `b`), per collective (`op`,
`size_bytes`), per node verdict and reason, per straggler/SDC rank, and the run's time.
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    GOOD_LOW,
    JSON,
    TABLE_CUSTOM,
    TABLE_TRANSFORM,
    Dashboard,
    Query,
    bargauge_options,
    query_variable,
    stat_options,
    table_options,
)

N = 'node=~"$node"'


def build() -> JSON:
    d = Dashboard(
        uid="sentinel-burn-in",
        title="Sentinel / Burn-in",
        description="The last burn-in: verdicts, the link bandwidth matrix, collective bus "
        "bandwidth by size, stragglers and SDC results.",
        tags=["sentinel", "burn-in"],
        variables=[
            query_variable("node", "Node", "label_values(sentinel_burnin_node_verdict, node)")
        ],
    )
    d.row("Verdict")
    d.add(
        "stat",
        "Burn-in verdict",
        "fail when any node failed or a fleet-wide check did.",
        [Query('max(sentinel_burnin_verdict{verdict="fail"})')],
        "none",
        GOOD_LOW,
        w=6,
        h=5,
        options=stat_options(),
        mappings=[
            {
                "type": "value",
                "options": {
                    "0": {"index": 0, "text": "pass", "color": "green"},
                    "1": {"index": 1, "text": "fail", "color": "red"},
                },
            }
        ],
    )
    d.add(
        "stat",
        "Age of the last burn-in",
        "A gang that has not been burned in for a day should be again before a long run.",
        [Query("time() - max(sentinel_burnin_last_run_timestamp_seconds)")],
        "s",
        ((None, "green"), (86400, "orange")),
        w=6,
        h=5,
        options=stat_options(),
    )
    d.add(
        "table",
        "Nodes excluded",
        "Nodes the burn-in failed, with each reason; they go to the exclude list.",
        [Query(f"sentinel_burnin_node_reason{{{N}}} == 1", instant=True, table=True)],
        "none",
        GOOD_LOW,
        w=12,
        h=5,
        options=table_options("node"),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.row("Links and collectives")
    d.add(
        "table",
        "Link bandwidth matrix",
        "Measured bandwidth of each pairwise link test (rows a, columns b); a dim cell is a bad "
        "node or cable.",
        [
            Query(
                'sentinel_burnin_link_bandwidth_bytes_per_second{a=~"$node"}',
                instant=True,
                table=True,
            )
        ],
        "Bps",
        ((None, "red"), (1e9, "orange"), (1e10, "green")),
        w=12,
        h=10,
        custom={"cellOptions": {"type": "color-background"}, "align": "center"},
        transformations=[
            {
                "id": "groupingToMatrix",
                "options": {"rowField": "a", "columnField": "b", "valueField": "Value"},
            }
        ],
        options={"showHeader": True},
    )
    d.add(
        "barchart",
        "Collective bus bandwidth by size",
        "busbw (nccl-tests formula) per collective and message size.",
        [
            Query(
                "sentinel_burnin_collective_busbw_bytes_per_second",
                "{{op}} {{size_bytes}}",
                instant=True,
                table=True,
            )
        ],
        "Bps",
        ((None, "green"),),
        w=12,
        h=10,
        options={
            "orientation": "horizontal",
            "xField": "size_bytes",
            "showValue": "auto",
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        },
        transformations=[
            {"id": "labelsToFields", "options": {"mode": "columns"}},
            {
                "id": "groupingToMatrix",
                "options": {"rowField": "size_bytes", "columnField": "op", "valueField": "Value"},
            },
        ],
    )
    d.add(
        "stat",
        "Wrong collective results",
        "Collectives whose result was not exact: a bad GPU, NIC or cable corrupts data in flight.",
        [Query("count(sentinel_burnin_collective_correct == 0) or vector(0)")],
        "none",
        GOOD_LOW,
        w=12,
        h=4,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Failed links",
        "Pairwise link tests under the bandwidth threshold.",
        [Query("count(sentinel_burnin_link_ok == 0) or vector(0)")],
        "none",
        GOOD_LOW,
        w=12,
        h=4,
        options=stat_options(),
    )
    d.row("Stragglers and SDC")
    d.add(
        "table",
        "Straggler ranks",
        "Ranks flagged slow by the timed GEMMs (their nodes fail the burn-in).",
        [Query("sentinel_burnin_straggler == 1", instant=True, table=True)],
        "none",
        GOOD_LOW,
        w=8,
        options=table_options("rank"),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.add(
        "bargauge",
        "GEMM time over the median, per rank",
        "Each rank's timed GEMM over the gang's median: 1.2 is 20% slower than its peers.",
        [Query("sort_desc(sentinel_burnin_straggler_slowdown_ratio)", "rank {{rank}}", True)],
        "percentunit",
        ((None, "green"), (1.1, "orange"), (1.25, "red")),
        w=8,
        options=bargauge_options(),
        min_value=0.8,
        max_value=1.5,
    )
    d.add(
        "table",
        "SDC recompute mismatches",
        "Ranks whose recomputed result differed from the others': suspect silent data "
        "corruption and exclude the GPU.",
        [Query("sentinel_burnin_sdc_mismatch == 1", instant=True, table=True)],
        "none",
        GOOD_LOW,
        w=8,
        options=table_options("rank"),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    return d.to_json()
