"""Node-level series: expected and visible GPUs, sweep freshness, a stalled NVML call, and
the inputs the catalog could not read (unknown XIDs and recovery actions, kernel-log garbage)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sentinel.agent.monitor import NodeMonitor, Snapshot

F = TypeVar("F", GaugeMetricFamily, CounterMetricFamily)


def family(
    cls: type[F], name: str, help_: str, labels: list[str], rows: list[tuple[list[str], float]]
) -> F:
    fam = cls(name, help_, labels=labels)
    for label_values, value in rows:
        fam.add_metric(label_values, float(value))
    return fam


def node_families(node_id: str, monitor: NodeMonitor, snap: Snapshot) -> Iterator[Metric]:
    node = [node_id]
    gauge = GaugeMetricFamily
    if monitor.expected_gpus is not None:
        yield family(
            gauge,
            "sentinel_node_gpus_expected",
            "GPUs this node should have.",
            ["node"],
            [(node, monitor.expected_gpus)],
        )
    yield family(
        gauge,
        "sentinel_node_gpus_visible",
        "GPUs NVML lists.",
        ["node"],
        [(node, len(snap.readings))],
    )
    yield family(
        gauge,
        "sentinel_agent_last_sweep_timestamp_seconds",
        "When the last full sweep of every GPU finished (stops moving while NVML hangs).",
        ["node"],
        [(node, monitor.last_sweep_ts)],
    )
    stall = snap.stall
    yield family(
        gauge,
        "sentinel_agent_nvml_call_stalled_seconds",
        "How long the NVML call named by `call` has been running past its deadline.",
        ["node", "call"],
        [([node_id, stall.call], stall.elapsed_s)] if stall is not None else [],
    )


def input_families(node_id: str, monitor: NodeMonitor) -> Iterator[Metric]:
    counts = dict(monitor.evaluator.unknown)
    log = monitor.kernel_log
    if log is not None:
        counts.update({f"kmsg: {why}": n for why, n in log.garbage.items()})
    for kind in ("xid", "recovery_action"):
        counts.setdefault(kind, 0)
    yield family(
        CounterMetricFamily,
        "sentinel_agent_unknown_inputs",
        "Inputs the fault catalog cannot read (unknown XIDs and recovery actions, garbage "
        "kernel-log lines), by kind; each also raises unknown_signal.",
        ["node", "kind"],
        [([node_id, kind], n) for kind, n in sorted(counts.items())],
    )
    yield family(
        CounterMetricFamily,
        "sentinel_agent_xid_reports",
        "XID reports admitted by source; one seen by both NVML and the kernel log counts once.",
        ["node", "source"],
        [([node_id, source], monitor.xids.sources[source]) for source in ("nvml", "kmsg")],
    )
    if log is not None:
        yield family(
            CounterMetricFamily,
            "sentinel_agent_kernel_log_records",
            "Kernel-log records read.",
            ["node"],
            [([node_id], log.records)],
        )
