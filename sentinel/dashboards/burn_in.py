"""Burn-in: the gang test before a job gets the fleet.

Source: the burn-in report (`sentinel burnin --json`) turned into `sentinel_burnin_*` series by
`sentinel dashboards burnin-textfile` for node_exporter's textfile collector
(`sentinel/dashboards/burnin_metrics.py`): one series per link (`a`, `b`), per collective (`op`,
`size_bytes`), per node verdict and reason, per straggler/SDC rank, and the run's time.
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    GOOD_LOW,
    Panel,
    Query,
    Row,
    Spec,
    query_variable,
    table_options,
)

PANELS: list[Row | Panel] = [
    Row("Verdict"),
    Panel(
        "stat",
        "Burn-in verdict",
        "fail when any node failed or a fleet-wide check did.",
        [Query('max(sentinel_burnin_verdict{verdict="fail"})')],
        steps=GOOD_LOW,
        w=6,
        h=5,
        mappings=[
            {
                "options": {
                    "0": {"color": "green", "index": 0, "text": "pass"},
                    "1": {"color": "red", "index": 1, "text": "fail"},
                },
                "type": "value",
            }
        ],
    ),
    Panel(
        "stat",
        "Age of the last burn-in",
        "A gang that has not been burned in for a day should be again before a long run.",
        [Query("time() - max(sentinel_burnin_last_run_timestamp_seconds)")],
        unit="s",
        steps=((None, "green"), (86400, "orange")),
        w=6,
        h=5,
    ),
    Panel(
        "table",
        "Nodes excluded",
        "Nodes the burn-in failed, with each reason; they go to the exclude list.",
        [Query('sentinel_burnin_node_reason{node=~"$node"} == 1', instant=True, table=True)],
        steps=GOOD_LOW,
        h=5,
        options=table_options("node"),
    ),
    Row("Links and collectives"),
    Panel(
        "table",
        "Link bandwidth matrix",
        "Measured bandwidth of each pairwise link test (rows a, columns b); a dim cell is a bad node or cable.",
        [
            Query(
                'sentinel_burnin_link_bandwidth_bytes_per_second{a=~"$node"}',
                instant=True,
                table=True,
            )
        ],
        unit="Bps",
        steps=((None, "red"), (1000000000.0, "orange"), (10000000000.0, "green")),
        h=10,
        options={"showHeader": True},
        custom={"align": "center", "cellOptions": {"type": "color-background"}},
        transformations=[
            {
                "id": "groupingToMatrix",
                "options": {"columnField": "b", "rowField": "a", "valueField": "Value"},
            }
        ],
    ),
    Panel(
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
        unit="Bps",
        h=10,
        options={
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "orientation": "horizontal",
            "showValue": "auto",
            "xField": "size_bytes",
        },
        transformations=[
            {"id": "labelsToFields", "options": {"mode": "columns"}},
            {
                "id": "groupingToMatrix",
                "options": {"columnField": "op", "rowField": "size_bytes", "valueField": "Value"},
            },
        ],
    ),
    Panel(
        "stat",
        "Wrong collective results",
        "Collectives whose result was not exact: a bad GPU, NIC or cable corrupts data in flight.",
        [Query("count(sentinel_burnin_collective_correct == 0) or vector(0)")],
        steps=GOOD_LOW,
        h=4,
    ),
    Panel(
        "stat",
        "Failed links",
        "Pairwise link tests under the bandwidth threshold.",
        [Query("count(sentinel_burnin_link_ok == 0) or vector(0)")],
        steps=GOOD_LOW,
        h=4,
    ),
    Row("Stragglers and SDC"),
    Panel(
        "table",
        "Straggler ranks",
        "Ranks flagged slow by the timed GEMMs (their nodes fail the burn-in).",
        [Query("sentinel_burnin_straggler == 1", instant=True, table=True)],
        steps=GOOD_LOW,
        w=8,
        options=table_options("rank"),
    ),
    Panel(
        "bargauge",
        "GEMM time over the median, per rank",
        "Each rank's timed GEMM over the gang's median: 1.2 is 20% slower than its peers.",
        [
            Query(
                "sort_desc(sentinel_burnin_straggler_slowdown_ratio)", "rank {{rank}}", instant=True
            )
        ],
        unit="percentunit",
        steps=((None, "green"), (1.1, "orange"), (1.25, "red")),
        w=8,
        min=0.8,
        max=1.5,
    ),
    Panel(
        "table",
        "SDC recompute mismatches",
        "Ranks whose recomputed result differed from the others': suspect silent data corruption and exclude the GPU.",
        [Query("sentinel_burnin_sdc_mismatch == 1", instant=True, table=True)],
        steps=GOOD_LOW,
        w=8,
        options=table_options("rank"),
    ),
]

SPEC = Spec(
    uid="sentinel-burn-in",
    title="Sentinel / Burn-in",
    description="The last burn-in: verdicts, the link bandwidth matrix, collective bus bandwidth by size, stragglers and SDC results.",
    tags=["burn-in", "sentinel"],
    panels=PANELS,
    variables=[query_variable("node", "Node", "label_values(sentinel_burnin_node_verdict, node)")],
    annotations=[],
)
