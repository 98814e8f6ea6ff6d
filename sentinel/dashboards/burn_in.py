"""Burn-in: the gang test before a job gets the fleet.

Source: the burn-in report (`sentinel burnin --json`), exported as `sentinel_burnin_*` series for
node_exporter's textfile collector: one series per link (`a`, `b`), per collective (`op`,
`size_bytes`), per node verdict and per straggler/SDC rank, plus the run's timestamp.
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    GOOD_LOW,
    JSON,
    TABLE_CUSTOM,
    TABLE_TRANSFORM,
    Dashboard,
    Query,
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
        "Nodes the burn-in failed, with the reason; they go to the exclude list.",
        [
            Query(
                f'sentinel_burnin_node_verdict{{{N}, verdict="fail"}} == 1',
                instant=True,
                table=True,
            )
        ],
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
        "busbw (nccl-tests formula) per collective and message size; red when the result was "
        "wrong.",
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
    d.row("Stragglers and SDC")
    d.add(
        "table",
        "Straggler ranks",
        "Ranks whose timed GEMMs ran slower than the gang's median, by how much.",
        [
            Query(
                "sort_desc(sentinel_burnin_straggler_slowdown_ratio)",
                instant=True,
                table=True,
            )
        ],
        "percentunit",
        ((None, "green"), (1.1, "orange"), (1.25, "red")),
        options=table_options(),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.add(
        "table",
        "SDC recompute mismatches",
        "Ranks whose recomputed result differed from the others': suspect silent data "
        "corruption and exclude the GPU.",
        [Query("sentinel_burnin_sdc_mismatch == 1", instant=True, table=True)],
        "none",
        GOOD_LOW,
        options=table_options("rank"),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    return d.to_json()
