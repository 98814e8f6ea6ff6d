"""Fleet health: every node and GPU the agents watch, worst offenders first.

Source: the node agent's `/metrics` (`sentinel_*` with labels node/gpu). The last panels show the
dcgm-exporter-compatible series the agent also serves, so a fleet mixing agents and dcgm-exporter
reads the same.
"""

from __future__ import annotations

from sentinel.dashboards.panels import (
    GOOD_LOW,
    JSON,
    NEUTRAL,
    TABLE_CUSTOM,
    TABLE_TRANSFORM,
    THRESHOLD_LINES,
    TIMESERIES_CUSTOM,
    Dashboard,
    Query,
    bargauge_options,
    prometheus_annotation,
    query_variable,
    stat_options,
    table_options,
    timeseries_options,
    value_mappings,
)

N = 'node=~"$node"'
G = 'node=~"$node", gpu=~"$gpu"'
DCGM = 'Hostname=~"$node", gpu=~"$gpu"'
VERDICTS = value_mappings(
    {0: ("healthy", "green"), 1: ("degraded", "orange"), 2: ("unhealthy", "red")}
)
VERDICT_STEPS = ((None, "green"), (1, "orange"), (2, "red"))
# A GPU's counter for an XID code appears with its first occurrence, where increase() sees no
# change: new series count as well.
XID = f"sentinel_gpu_xid_errors_total{{{G}}}"
XID_NEW = (
    f"sum by (node, gpu, xid) (increase({XID}[2m])) > 0"
    f" or sum by (node, gpu, xid) ({XID} unless {XID} offset 2m)"
)
SEVERITY = (
    f'sum by (node, gpu) (sentinel_gpu_health_verdict{{{G}, verdict="degraded"}})'
    f' + 2 * sum by (node, gpu) (sentinel_gpu_health_verdict{{{G}, verdict="unhealthy"}})'
)


def build() -> JSON:
    d = Dashboard(
        uid="sentinel-fleet-health",
        title="Sentinel / Fleet health",
        description="Per node and GPU: verdicts, recommended actions, thermals, power, clocks, "
        "utilization, memory, ECC, XIDs, row remapping, throttling. Worst offenders first.",
        tags=["sentinel", "gpu", "fleet"],
        variables=[
            query_variable("node", "Node", "label_values(sentinel_node_health_verdict, node)"),
            query_variable("gpu", "GPU", 'label_values(sentinel_gpu_info{node=~"$node"}, gpu)'),
        ],
        annotations=[
            prometheus_annotation(
                "XID",
                XID_NEW,
                "red",
                "XID {{xid}} on {{node}} GPU {{gpu}}",
            )
        ],
    )
    _verdicts(d)
    _thermals(d)
    _clocks(d)
    _memory_errors(d)
    _host_and_agent(d)
    return d.to_json()


def _verdicts(d: Dashboard) -> None:
    d.row("Verdicts and recommended actions")
    for title, verdict in (("Nodes unhealthy", "unhealthy"), ("Nodes degraded", "degraded")):
        d.add(
            "stat",
            title,
            f"Nodes whose agent judges them {verdict} (the worst GPU decides).",
            [
                Query(
                    f'count(sentinel_node_health_verdict{{{N}, verdict="{verdict}"}} == 1) or vector(0)'
                )
            ],
            "none",
            GOOD_LOW if verdict == "unhealthy" else ((None, "green"), (1, "orange")),
            w=4,
            h=5,
            options=stat_options(),
        )
    d.add(
        "stat",
        "GPUs lost",
        "GPUs that stopped answering NVML (fallen off the bus, XID 79).",
        [Query(f"sum(sentinel_gpu_lost{{{G}}}) or vector(0)")],
        "none",
        GOOD_LOW,
        w=4,
        h=5,
        options=stat_options(),
    )
    d.add(
        "stat",
        "Agents up",
        "Agents Prometheus scraped successfully / agents it knows of.",
        [Query('sum(up{job="sentinel-agent"}) / count(up{job="sentinel-agent"})')],
        "percentunit",
        ((None, "red"), (0.99, "orange"), (1, "green")),
        w=4,
        h=5,
        options=stat_options(),
        min_value=0,
        max_value=1,
    )
    d.add(
        "state-timeline",
        "Node verdict over time",
        "0 healthy, 1 degraded, 2 unhealthy.",
        [
            Query(
                f'sum by (node) (sentinel_node_health_verdict{{{N}, verdict="degraded"}})'
                f' + 2 * sum by (node) (sentinel_node_health_verdict{{{N}, verdict="unhealthy"}})',
                "{{node}}",
            )
        ],
        "none",
        VERDICT_STEPS,
        w=8,
        h=5,
        mappings=VERDICTS,
        options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8},
    )
    d.add(
        "table",
        "Worst GPUs (verdict severity)",
        "GPUs sorted by verdict: 2 unhealthy, 1 degraded, 0 healthy.",
        [Query(f"topk(20, {SEVERITY})", instant=True, table=True)],
        "none",
        VERDICT_STEPS,
        w=8,
        h=9,
        options=table_options(),
        mappings=VERDICTS,
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.add(
        "table",
        "Health rules firing",
        "Every health rule currently firing, with the verdict it gives. XIDs appear as xid_<code>.",
        [Query(f"sort_desc(sentinel_gpu_health_finding{{{G}}} == 1)", instant=True, table=True)],
        "none",
        ((None, "orange"),),
        w=8,
        h=9,
        options=table_options("verdict"),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.add(
        "table",
        "Recommended actions",
        "What each node and GPU needs, from least to most disruptive: none, restart_job, "
        "reset_gpu, reboot_node, drain_and_inspect.",
        [
            Query(
                f'sentinel_gpu_recommended_action{{{G}, action!="none"}} == 1',
                instant=True,
                table=True,
            ),
            Query(f"sentinel_node_recommended_action{{{N}}} == 1", instant=True, table=True),
        ],
        "none",
        ((None, "orange"),),
        w=8,
        h=9,
        options=table_options("action"),
        custom=TABLE_CUSTOM,
        transformations=[{"id": "merge", "options": {}}, *TABLE_TRANSFORM],
    )


def _thermals(d: Dashboard) -> None:
    d.row("Thermals and power")
    d.add(
        "timeseries",
        "GPU temperature",
        "Core temperature; the agent marks a GPU degraded at 85 °C and unhealthy at 92 °C.",
        [Query(f"sort_desc(sentinel_gpu_temperature_celsius{{{G}}})", "{{node}}/{{gpu}}")],
        "celsius",
        ((None, "green"), (85, "orange"), (92, "red")),
        options=timeseries_options(),
        custom=THRESHOLD_LINES,
    )
    d.add(
        "bargauge",
        "Hottest GPUs now",
        "The ten hottest GPUs (core temperature).",
        [Query(f"topk(10, sentinel_gpu_temperature_celsius{{{G}}})", "{{node}}/{{gpu}}", True)],
        "celsius",
        ((None, "green"), (85, "orange"), (92, "red")),
        options=bargauge_options(),
        min_value=20,
        max_value=100,
    )
    d.add(
        "timeseries",
        "HBM temperature",
        "Memory temperature; degraded at 95 °C, unhealthy at 105 °C.",
        [Query(f"sentinel_gpu_memory_temperature_celsius{{{G}}}", "{{node}}/{{gpu}}")],
        "celsius",
        ((None, "green"), (95, "orange"), (105, "red")),
        options=timeseries_options(),
        custom=THRESHOLD_LINES,
    )
    d.add(
        "timeseries",
        "Power draw (share of limit)",
        "Power draw over the enforced power limit; sustained 100% means the SW power cap is "
        "holding the clocks.",
        [
            Query(
                f"sentinel_gpu_power_watts{{{G}}} / sentinel_gpu_power_limit_watts{{{G}}}",
                "{{node}}/{{gpu}}",
            )
        ],
        "percentunit",
        ((None, "green"), (0.98, "orange")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
        min_value=0,
    )


def _clocks(d: Dashboard) -> None:
    d.row("Clocks, utilization, memory, throttling")
    d.add(
        "timeseries",
        "SM clock",
        "Lowest first: a GPU whose SM clock falls below its peers is throttling.",
        [Query(f"sort(sentinel_gpu_sm_clock_hertz{{{G}}})", "{{node}}/{{gpu}}")],
        "hertz",
        ((None, "red"), (1e9, "green")),
        options=timeseries_options(sort_desc=False),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "GPU utilization",
        "Share of time a kernel was running; tensor-pipe activity where the GPU reports it.",
        [
            Query(f"sentinel_gpu_utilization_ratio{{{G}}}", "{{node}}/{{gpu}} busy"),
            Query(f"sentinel_gpu_tensor_active_ratio{{{G}}}", "{{node}}/{{gpu}} tensor"),
        ],
        "percentunit",
        ((None, "orange"), (0.5, "green")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
        min_value=0,
        max_value=1,
    )
    d.add(
        "timeseries",
        "Framebuffer used",
        "Framebuffer memory in use over its size.",
        [
            Query(
                f"sentinel_gpu_framebuffer_used_bytes{{{G}}} / sentinel_gpu_framebuffer_bytes{{{G}}}",
                "{{node}}/{{gpu}}",
            )
        ],
        "percentunit",
        ((None, "green"), (0.95, "orange")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
        min_value=0,
        max_value=1,
    )
    d.add(
        "timeseries",
        "Throttle reasons active",
        "GPUs held back by thermal slowdown, HW slowdown or the power brake (1 = active). "
        "The SW power cap is normal under load and left out.",
        [
            Query(
                f'max by (node, gpu, reason) (sentinel_gpu_throttle_active{{{G}, reason=~"hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"}})',
                "{{node}}/{{gpu}} {{reason}}",
            )
        ],
        "bool_on_off",
        GOOD_LOW,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM | {"drawStyle": "line", "lineInterpolation": "stepAfter"},
        min_value=0,
        max_value=1,
    )


def _memory_errors(d: Dashboard) -> None:
    d.row("ECC, XIDs, row remapping, links")
    d.add(
        "bargauge",
        "Volatile double-bit ECC errors",
        "Uncorrectable errors since the last GPU reset: any is unhealthy (reset the GPU).",
        [
            Query(
                f'sort_desc(sentinel_gpu_ecc_errors_total{{{G}, type="dbe", scope="volatile"}})',
                "{{node}}/{{gpu}}",
                True,
            )
        ],
        "none",
        GOOD_LOW,
        options=bargauge_options(),
        min_value=0,
    )
    d.add(
        "timeseries",
        "ECC errors (rate)",
        "Corrected (sbe) and uncorrected (dbe) ECC errors per second, aggregate counters.",
        [
            Query(
                f'sum by (node, gpu, type) (rate(sentinel_gpu_ecc_errors_total{{{G}, scope="aggregate"}}[$__rate_interval]))',
                "{{node}}/{{gpu}} {{type}}",
            )
        ],
        "cps",
        ((None, "green"), (0.1, "orange")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "table",
        "XIDs by code (since agent start)",
        "Every XID seen, per code (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS keeps only the last). "
        "79 fallen off the bus, 48 DBE, 94/95 contained/uncontained ECC, 119/120 GSP.",
        [
            Query(
                f"sort_desc(max by (node, gpu, xid) (sentinel_gpu_xid_errors_total{{{G}}}))",
                instant=True,
                table=True,
            )
        ],
        "none",
        GOOD_LOW,
        options=table_options(),
        custom=TABLE_CUSTOM,
        transformations=TABLE_TRANSFORM,
    )
    d.add(
        "timeseries",
        "Last XID (dcgm-exporter series)",
        "DCGM_FI_DEV_XID_ERRORS: the last XID code per GPU, as dcgm-exporter reports it.",
        [
            Query(
                f"max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS{{{DCGM}}})", "{{Hostname}}/{{gpu}}"
            )
        ],
        "none",
        GOOD_LOW,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM | {"drawStyle": "points"},
    )
    d.add(
        "timeseries",
        "Remapped rows",
        "HBM rows remapped after correctable/uncorrectable errors.",
        [Query(f"sort_desc(sentinel_gpu_remapped_rows_total{{{G}}})", "{{node}}/{{gpu}} {{kind}}")],
        "none",
        ((None, "green"), (1, "orange")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "stat",
        "Row remap pending / failed",
        "Pending: a remap waits for a GPU reset. Failed: no spare rows left, drain the GPU.",
        [
            Query(f"sum(sentinel_gpu_remapped_rows_pending{{{G}}})", "pending"),
            Query(f"sum(sentinel_gpu_remapped_rows_failure{{{G}}})", "failed"),
        ],
        "none",
        GOOD_LOW,
        w=6,
        options=stat_options() | {"textMode": "value_and_name"},
    )
    d.add(
        "stat",
        "Retired pages (pre-Ampere GPUs)",
        "Framebuffer pages retired (SBE + DBE); 48 or more is unhealthy. Ampere and later GPUs "
        "remap rows instead and report no retired pages.",
        [Query(f"sum(sentinel_gpu_retired_pages_total{{{G}}})")],
        "none",
        ((None, "green"), (1, "orange"), (48, "red")),
        w=6,
        options=stat_options(),
    )
    d.add(
        "timeseries",
        "PCIe replays and NVLink errors (rate)",
        "Link-level retries per second: rising replays point at a bad riser, cable or switch.",
        [
            Query(
                f"rate(sentinel_gpu_pcie_replays_total{{{G}}}[$__rate_interval])",
                "{{node}}/{{gpu}} pcie",
            ),
            Query(
                f"sum by (node, gpu, type) (rate(sentinel_gpu_nvlink_errors_total{{{G}}}[$__rate_interval]))",
                "{{node}}/{{gpu}} nvlink {{type}}",
            ),
        ],
        "cps",
        ((None, "green"), (1, "orange")),
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )


def _host_and_agent(d: Dashboard) -> None:
    d.row("Hosts and agents")
    d.add(
        "timeseries",
        "Host CPU and memory",
        "Host CPU busy and memory in use, per node.",
        [
            Query(f"sentinel_host_cpu_utilization_ratio{{{N}}}", "{{node}} cpu"),
            Query(
                f"sentinel_host_memory_used_bytes{{{N}}} / sentinel_host_memory_bytes{{{N}}}",
                "{{node}} memory",
            ),
        ],
        "percentunit",
        ((None, "green"), (0.9, "orange")),
        w=8,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
        min_value=0,
        max_value=1,
    )
    d.add(
        "timeseries",
        "Agent sweep duration (p99)",
        "Time one NVML + host sweep takes; a slow driver shows here first.",
        [
            Query(
                'histogram_quantile(0.99, sum by (instance, le) (rate(sentinel_agent_collection_duration_seconds_bucket{job="sentinel-agent"}[$__rate_interval])))',
                "{{instance}}",
            )
        ],
        "s",
        ((None, "green"), (1, "orange")),
        w=8,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Agent event spool",
        "Events waiting on disk for the coordinator; growth means delivery is failing.",
        [Query('sentinel_agent_spooled_events{job="sentinel-agent"}', "{{instance}}")],
        "none",
        ((None, "green"), (1000, "orange")),
        w=8,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "GPU temperature by host (dcgm-exporter series)",
        "The query a dcgm-exporter dashboard runs, answered by Sentinel's compatible series.",
        [Query(f"avg by (Hostname) (DCGM_FI_DEV_GPU_TEMP{{{DCGM}}})", "{{Hostname}}")],
        "celsius",
        ((None, "green"), (85, "orange"), (92, "red")),
        w=12,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
    d.add(
        "timeseries",
        "Power by host (dcgm-exporter series)",
        "DCGM_FI_DEV_POWER_USAGE summed per host.",
        [Query(f"sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE{{{DCGM}}})", "{{Hostname}}")],
        "watt",
        NEUTRAL,
        w=12,
        options=timeseries_options(),
        custom=TIMESERIES_CUSTOM,
    )
