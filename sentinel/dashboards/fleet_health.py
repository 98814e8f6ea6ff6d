"""Fleet health: every node and GPU the agents watch, worst offenders first.

Source: the node agent's `/metrics` (`sentinel_*` with labels node/gpu). The last panels show the
dcgm-exporter-compatible series the agent also serves, so a fleet mixing agents and dcgm-exporter
reads the same, in either naming of dcgm-exporter's (up to 4.8, or 4.9's DCGM 4.7 names).
"""

from __future__ import annotations

from sentinel.agent.export.dcgm import promql
from sentinel.dashboards.panels import (
    GOOD_LOW,
    TABLE_TRANSFORM,
    THRESHOLD_LINES,
    Panel,
    Query,
    Row,
    Spec,
    prometheus_annotation,
    query_variable,
    table_options,
    timeseries_options,
)


def _dcgm(legacy: str) -> str:
    """A dcgm-exporter series on the dashboard's node and GPU, in either naming."""
    return promql(legacy, host='=~"$node"', rest='gpu=~"$gpu"')


PANELS: list[Row | Panel] = [
    Row("Verdicts and recommended actions"),
    Panel(
        "stat",
        "Nodes unhealthy",
        "Nodes whose agent judges them unhealthy (the worst GPU decides).",
        [
            Query(
                'count(sentinel_node_health_verdict{node=~"$node", verdict="unhealthy"} == 1) or vector(0)'
            )
        ],
        steps=GOOD_LOW,
        w=4,
        h=5,
    ),
    Panel(
        "stat",
        "Nodes degraded",
        "Nodes whose agent judges them degraded (the worst GPU decides).",
        [
            Query(
                'count(sentinel_node_health_verdict{node=~"$node", verdict="degraded"} == 1) or vector(0)'
            )
        ],
        steps=((None, "green"), (1, "orange")),
        w=4,
        h=5,
    ),
    Panel(
        "stat",
        "GPUs lost",
        "GPUs that stopped answering NVML (fallen off the bus, XID 79).",
        [Query('sum(sentinel_gpu_lost{node=~"$node", gpu=~"$gpu"}) or vector(0)')],
        steps=GOOD_LOW,
        w=4,
        h=5,
    ),
    Panel(
        "stat",
        "Agents up",
        "Agents Prometheus scraped successfully / agents it knows of.",
        [Query('sum(up{job="sentinel-agent"}) / count(up{job="sentinel-agent"})')],
        unit="percentunit",
        steps=((None, "red"), (0.99, "orange"), (1, "green")),
        w=4,
        h=5,
        min=0,
        max=1,
    ),
    Panel(
        "state-timeline",
        "Node verdict over time",
        "0 healthy, 1 degraded, 2 unhealthy. The 10 nodes with the highest values, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, sum by (node) (sentinel_node_health_verdict{node=~"$node", verdict="degraded"}) + 2 * sum by (node) (sentinel_node_health_verdict{node=~"$node", verdict="unhealthy"}))',
                "{{node}}",
            )
        ],
        steps=((None, "green"), (1, "orange"), (2, "red")),
        w=8,
        h=5,
        options={"mergeValues": True, "rowHeight": 0.8, "showValue": "never"},
        mappings=[
            {
                "options": {
                    "0": {"color": "green", "index": 0, "text": "healthy"},
                    "1": {"color": "orange", "index": 1, "text": "degraded"},
                    "2": {"color": "red", "index": 2, "text": "unhealthy"},
                },
                "type": "value",
            }
        ],
    ),
    Panel(
        "table",
        "Worst GPUs (verdict severity)",
        "GPUs sorted by verdict: 2 unhealthy, 1 degraded, 0 healthy.",
        [
            Query(
                'topk(20, sum by (node, gpu) (sentinel_gpu_health_verdict{node=~"$node", gpu=~"$gpu", verdict="degraded"}) + 2 * sum by (node, gpu) (sentinel_gpu_health_verdict{node=~"$node", gpu=~"$gpu", verdict="unhealthy"}))',
                instant=True,
                table=True,
            )
        ],
        steps=((None, "green"), (1, "orange"), (2, "red")),
        w=8,
        h=9,
        mappings=[
            {
                "options": {
                    "0": {"color": "green", "index": 0, "text": "healthy"},
                    "1": {"color": "orange", "index": 1, "text": "degraded"},
                    "2": {"color": "red", "index": 2, "text": "unhealthy"},
                },
                "type": "value",
            }
        ],
    ),
    Panel(
        "table",
        "Health rules firing",
        "Every health rule currently firing, with the verdict it gives. XIDs appear as xid_<code>.",
        [
            Query(
                'sort_desc(sentinel_gpu_health_finding{node=~"$node", gpu=~"$gpu"} == 1)',
                instant=True,
                table=True,
            )
        ],
        steps=((None, "orange"),),
        w=8,
        h=9,
        options=table_options("verdict"),
    ),
    Panel(
        "table",
        "Recommended actions",
        "What each node and GPU needs, from least to most disruptive: none, restart_job, reset_gpu, reboot_node, drain_and_inspect.",
        [
            Query(
                'sentinel_gpu_recommended_action{node=~"$node", gpu=~"$gpu", action!="none"} == 1',
                instant=True,
                table=True,
            ),
            Query('sentinel_node_recommended_action{node=~"$node"} == 1', instant=True, table=True),
        ],
        steps=((None, "orange"),),
        w=8,
        h=9,
        options=table_options("action"),
        transformations=[{"id": "merge", "options": {}}, *TABLE_TRANSFORM],
    ),
    Row("Thermals and power"),
    Panel(
        "timeseries",
        "GPU temperature",
        "Core temperature; the agent marks a GPU degraded at 85 °C and unhealthy at 92 °C. The 10 GPUs with the highest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, sentinel_gpu_temperature_celsius{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}}",
            ),
            Query(
                'quantile(0.5, sentinel_gpu_temperature_celsius{node=~"$node", gpu=~"$gpu"})',
                "fleet median",
            ),
        ],
        unit="celsius",
        steps=((None, "green"), (85, "orange"), (92, "red")),
        custom=THRESHOLD_LINES,
    ),
    Panel(
        "bargauge",
        "Hottest GPUs now",
        "The ten hottest GPUs (core temperature).",
        [
            Query(
                'topk(10, sentinel_gpu_temperature_celsius{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}}",
                instant=True,
            )
        ],
        unit="celsius",
        steps=((None, "green"), (85, "orange"), (92, "red")),
        min=20,
        max=100,
    ),
    Panel(
        "timeseries",
        "HBM temperature",
        "Memory temperature; degraded at 95 °C, unhealthy at 105 °C. The 10 GPUs with the highest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, sentinel_gpu_memory_temperature_celsius{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}}",
            ),
            Query(
                'quantile(0.5, sentinel_gpu_memory_temperature_celsius{node=~"$node", gpu=~"$gpu"})',
                "fleet median",
            ),
        ],
        unit="celsius",
        steps=((None, "green"), (95, "orange"), (105, "red")),
        custom=THRESHOLD_LINES,
    ),
    Panel(
        "timeseries",
        "Power draw (share of limit)",
        "Power draw over the enforced power limit; sustained 100% means the SW power cap is holding the clocks. The 10 GPUs with the highest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, sentinel_gpu_power_watts{node=~"$node", gpu=~"$gpu"} / sentinel_gpu_power_limit_watts{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}}",
            ),
            Query(
                'quantile(0.5, sentinel_gpu_power_watts{node=~"$node", gpu=~"$gpu"} / sentinel_gpu_power_limit_watts{node=~"$node", gpu=~"$gpu"})',
                "fleet median",
            ),
        ],
        unit="percentunit",
        steps=((None, "green"), (0.98, "orange")),
        min=0,
    ),
    Row("Clocks, utilization, memory, throttling"),
    Panel(
        "timeseries",
        "SM clock",
        "Lowest first: a GPU whose SM clock falls below its peers is throttling. The 10 GPUs with the lowest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                'bottomk(10, sentinel_gpu_sm_clock_hertz{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}}",
            ),
            Query(
                'quantile(0.5, sentinel_gpu_sm_clock_hertz{node=~"$node", gpu=~"$gpu"})',
                "fleet median",
            ),
        ],
        unit="hertz",
        steps=((None, "red"), (1000000000.0, "green")),
        options=timeseries_options(sort_desc=False),
    ),
    Panel(
        "timeseries",
        "GPU utilization",
        "Share of time a kernel was running; tensor-pipe activity where the GPU reports it. The 10 GPUs with the lowest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                'bottomk(10, sentinel_gpu_utilization_ratio{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}} busy",
            ),
            Query(
                'quantile(0.5, sentinel_gpu_utilization_ratio{node=~"$node", gpu=~"$gpu"})',
                "fleet median busy",
            ),
            Query(
                'bottomk(10, sentinel_gpu_tensor_active_ratio{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}} tensor",
            ),
        ],
        unit="percentunit",
        steps=((None, "orange"), (0.5, "green")),
        min=0,
        max=1,
    ),
    Panel(
        "timeseries",
        "Framebuffer used",
        "Framebuffer memory in use over its size. The 10 GPUs with the highest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, sentinel_gpu_framebuffer_used_bytes{node=~"$node", gpu=~"$gpu"} / sentinel_gpu_framebuffer_bytes{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}}",
            ),
            Query(
                'quantile(0.5, sentinel_gpu_framebuffer_used_bytes{node=~"$node", gpu=~"$gpu"} / sentinel_gpu_framebuffer_bytes{node=~"$node", gpu=~"$gpu"})',
                "fleet median",
            ),
        ],
        unit="percentunit",
        steps=((None, "green"), (0.95, "orange")),
        min=0,
        max=1,
    ),
    Panel(
        "timeseries",
        "Throttle reasons active",
        "GPUs held back by thermal slowdown, HW slowdown or the power brake (1 = active). The SW power cap is normal under load and left out. The 10 GPUs with the highest values, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, max by (node, gpu, reason) (sentinel_gpu_throttle_active{node=~"$node", gpu=~"$gpu", reason=~"hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"}))',
                "{{node}}/{{gpu}} {{reason}}",
            )
        ],
        unit="bool_on_off",
        steps=GOOD_LOW,
        custom={
            "drawStyle": "line",
            "fillOpacity": 10,
            "lineInterpolation": "stepAfter",
            "lineWidth": 1,
        },
        min=0,
        max=1,
    ),
    Row("ECC, XIDs, row remapping, links"),
    Panel(
        "bargauge",
        "Volatile double-bit ECC errors",
        "Uncorrectable errors since the last GPU reset: any is unhealthy (reset the GPU).",
        [
            Query(
                'sort_desc(sentinel_gpu_ecc_errors_total{node=~"$node", gpu=~"$gpu", type="dbe", scope="volatile"})',
                "{{node}}/{{gpu}}",
                instant=True,
            )
        ],
        steps=GOOD_LOW,
        min=0,
    ),
    Panel(
        "timeseries",
        "ECC errors (rate)",
        "Corrected (sbe) and uncorrected (dbe) ECC errors per second, aggregate counters. The 10 GPUs with the highest values, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, sum by (node, gpu, type) (rate(sentinel_gpu_ecc_errors_total{node=~"$node", gpu=~"$gpu", scope="aggregate"}[$__rate_interval])))',
                "{{node}}/{{gpu}} {{type}}",
            )
        ],
        unit="cps",
        steps=((None, "green"), (0.1, "orange")),
    ),
    Panel(
        "table",
        "XIDs by code (since agent start)",
        "Every XID seen, per code (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS keeps only the last). 79 fallen off the bus, 48 DBE, 94/95 contained/uncontained ECC, 119/120 GSP.",
        [
            Query(
                'sort_desc(max by (node, gpu, xid) (sentinel_gpu_xid_errors_total{node=~"$node", gpu=~"$gpu"}))',
                instant=True,
                table=True,
            )
        ],
        steps=GOOD_LOW,
    ),
    Panel(
        "timeseries",
        "Last XID (dcgm-exporter series)",
        "DCGM_FI_DEV_XID_ERRORS (DCGM_FI_DEV_XID_ERROR in dcgm-exporter 4.9's naming): the last XID code per GPU, as dcgm-exporter reports it. The 10 GPUs with the highest values, so a fleet of thousands stays readable.",
        [
            Query(
                f"topk(10, max by (Hostname, gpu) ({_dcgm('DCGM_FI_DEV_XID_ERRORS')}))",
                "{{Hostname}}/{{gpu}}",
            )
        ],
        steps=GOOD_LOW,
        custom={"drawStyle": "points", "fillOpacity": 10, "lineWidth": 1},
    ),
    Panel(
        "timeseries",
        "Remapped rows",
        "HBM rows remapped after correctable/uncorrectable errors. The 10 GPUs with the highest values, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, sentinel_gpu_remapped_rows_total{node=~"$node", gpu=~"$gpu"})',
                "{{node}}/{{gpu}} {{kind}}",
            )
        ],
        steps=((None, "green"), (1, "orange")),
    ),
    Panel(
        "stat",
        "Row remap pending / failed",
        "Pending: a remap waits for a GPU reset. Failed: no spare rows left, drain the GPU.",
        [
            Query('sum(sentinel_gpu_remapped_rows_pending{node=~"$node", gpu=~"$gpu"})', "pending"),
            Query('sum(sentinel_gpu_remapped_rows_failure{node=~"$node", gpu=~"$gpu"})', "failed"),
        ],
        steps=GOOD_LOW,
        w=6,
        options={
            "colorMode": "background",
            "graphMode": "none",
            "justifyMode": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "value_and_name",
        },
    ),
    Panel(
        "stat",
        "Retired pages (pre-Ampere GPUs)",
        "Framebuffer pages retired (SBE + DBE); 48 or more is unhealthy. Ampere and later GPUs remap rows instead and report no retired pages.",
        [Query('sum(sentinel_gpu_retired_pages_total{node=~"$node", gpu=~"$gpu"})')],
        steps=((None, "green"), (1, "orange"), (48, "red")),
        w=6,
    ),
    Panel(
        "timeseries",
        "PCIe replays and NVLink errors (rate)",
        "Link-level retries per second: rising replays point at a bad riser, cable or switch. The 10 GPUs with the highest values, so a fleet of thousands stays readable.",
        [
            Query(
                'topk(10, rate(sentinel_gpu_pcie_replays_total{node=~"$node", gpu=~"$gpu"}[$__rate_interval]))',
                "{{node}}/{{gpu}} pcie",
            ),
            Query(
                'topk(10, sum by (node, gpu, type) (rate(sentinel_gpu_nvlink_errors_total{node=~"$node", gpu=~"$gpu"}[$__rate_interval])))',
                "{{node}}/{{gpu}} nvlink {{type}}",
            ),
        ],
        unit="cps",
        steps=((None, "green"), (1, "orange")),
    ),
    Row("Hosts and agents"),
    Panel(
        "timeseries",
        "Host CPU and memory",
        "Host CPU busy and memory in use, per node. The 10 nodes with the highest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query('topk(10, sentinel_host_cpu_utilization_ratio{node=~"$node"})', "{{node}} cpu"),
            Query(
                'quantile(0.5, sentinel_host_cpu_utilization_ratio{node=~"$node"})',
                "fleet median cpu",
            ),
            Query(
                'topk(10, sentinel_host_memory_used_bytes{node=~"$node"} / sentinel_host_memory_bytes{node=~"$node"})',
                "{{node}} memory",
            ),
        ],
        unit="percentunit",
        steps=((None, "green"), (0.9, "orange")),
        w=8,
        min=0,
        max=1,
    ),
    Panel(
        "timeseries",
        "Agent sweep duration (p99)",
        "Time one NVML + host sweep takes; a slow driver shows here first.",
        [
            Query(
                'histogram_quantile(0.99, sum by (instance, le) (rate(sentinel_agent_collection_duration_seconds_bucket{job="sentinel-agent"}[$__rate_interval])))',
                "{{instance}}",
            )
        ],
        unit="s",
        steps=((None, "green"), (1, "orange")),
        w=8,
    ),
    Panel(
        "timeseries",
        "Agent event spool",
        "Events waiting on disk for the coordinator; growth means delivery is failing.",
        [Query('sentinel_agent_spooled_events{job="sentinel-agent"}', "{{instance}}")],
        steps=((None, "green"), (1000, "orange")),
        w=8,
    ),
    Panel(
        "timeseries",
        "GPU temperature by host (dcgm-exporter series)",
        "The query a dcgm-exporter dashboard runs, answered by Sentinel's compatible series, in either naming of dcgm-exporter's. The 10 nodes with the highest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                f"topk(10, avg by (Hostname) ({_dcgm('DCGM_FI_DEV_GPU_TEMP')}))",
                "{{Hostname}}",
            ),
            Query(
                f"quantile(0.5, avg by (Hostname) ({_dcgm('DCGM_FI_DEV_GPU_TEMP')}))",
                "fleet median",
            ),
        ],
        unit="celsius",
        steps=((None, "green"), (85, "orange"), (92, "red")),
    ),
    Panel(
        "timeseries",
        "Power by host (dcgm-exporter series)",
        "DCGM_FI_DEV_POWER_USAGE summed per host. The 10 nodes with the highest values and the fleet median, so a fleet of thousands stays readable.",
        [
            Query(
                f"topk(10, sum by (Hostname) ({_dcgm('DCGM_FI_DEV_POWER_USAGE')}))",
                "{{Hostname}}",
            ),
            Query(
                f"quantile(0.5, sum by (Hostname) ({_dcgm('DCGM_FI_DEV_POWER_USAGE')}))",
                "fleet median",
            ),
        ],
        unit="watt",
    ),
]

SPEC = Spec(
    uid="sentinel-fleet-health",
    title="Sentinel / Fleet health",
    description="Per node and GPU: verdicts, recommended actions, thermals, power, clocks, utilization, memory, ECC, XIDs, row remapping, throttling. Worst offenders first.",
    tags=["fleet", "gpu", "sentinel"],
    panels=PANELS,
    variables=[
        query_variable("node", "Node", "label_values(sentinel_node_health_verdict, node)"),
        query_variable("gpu", "GPU", 'label_values(sentinel_gpu_info{node=~"$node"}, gpu)'),
    ],
    annotations=[
        prometheus_annotation(
            "XID",
            'sum by (node, gpu, xid) (increase(sentinel_gpu_xid_errors_total{node=~"$node", gpu=~"$gpu"}[2m])) > 0 or sum by (node, gpu, xid) (sentinel_gpu_xid_errors_total{node=~"$node", gpu=~"$gpu"} unless sentinel_gpu_xid_errors_total{node=~"$node", gpu=~"$gpu"} offset 2m)',
            "red",
            "XID {{xid}} on {{node}} GPU {{gpu}}",
        )
    ],
)
