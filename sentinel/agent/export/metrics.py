"""The agent's Prometheus exposition, built from the latest snapshot at scrape time.

Two sets of GPU series: Sentinel's own (Prometheus naming: base units, `_total` counters) and
dcgm-exporter-compatible ones (`dcgm.py`: the names, units and labels of dcgm-exporter's
defaults, in its legacy naming, DCGM 4.7's, or both), so the dashboards and alerts operators
already run keep working. A scrape never touches NVML: it renders what the last sweep read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sentinel.agent.export.dcgm import dcgm_families
from sentinel.agent.export.node_metrics import family, input_families, node_families
from sentinel.agent.health.rules import THROTTLE_REASONS
from sentinel.agent.monitor import NodeMonitor, Snapshot
from sentinel.agent.nvml.readings import GpuReading
from sentinel.config import DcgmNaming
from sentinel.protocol import Action, Verdict

Getter = Callable[[GpuReading], float | int | bool | None]


@dataclass(frozen=True)
class Series:
    name: str
    help: str
    get: Getter
    counter: bool = False


def _scaled(attr: str, factor: float) -> Getter:
    def get(r: GpuReading) -> float | None:
        v = getattr(r, attr)
        return None if v is None else v * factor

    return get


def _attr(attr: str) -> Getter:
    return lambda r: getattr(r, attr)


SENTINEL_GPU_SERIES = (
    Series("sentinel_gpu_temperature_celsius", "GPU core temperature.", _attr("temp_gpu_c")),
    Series("sentinel_gpu_memory_temperature_celsius", "HBM temperature.", _attr("temp_mem_c")),
    Series("sentinel_gpu_power_watts", "Power draw.", _attr("power_w")),
    Series("sentinel_gpu_power_limit_watts", "Enforced power limit.", _attr("power_limit_w")),
    Series(
        "sentinel_gpu_energy_joules",
        "Energy since driver load.",
        _scaled("energy_mj", 1e-3),
        counter=True,
    ),
    Series("sentinel_gpu_sm_clock_hertz", "SM clock.", _scaled("sm_clock_mhz", 1e6)),
    Series("sentinel_gpu_memory_clock_hertz", "Memory clock.", _scaled("mem_clock_mhz", 1e6)),
    Series("sentinel_gpu_utilization_ratio", "GPU busy.", _scaled("util_gpu_pct", 0.01)),
    Series(
        "sentinel_gpu_memory_utilization_ratio",
        "Memory controller busy.",
        _scaled("util_mem_pct", 0.01),
    ),
    Series("sentinel_gpu_framebuffer_used_bytes", "Framebuffer used.", _attr("fb_used_bytes")),
    Series("sentinel_gpu_framebuffer_free_bytes", "Framebuffer free.", _attr("fb_free_bytes")),
    Series("sentinel_gpu_framebuffer_bytes", "Framebuffer size.", _attr("fb_total_bytes")),
    Series(
        "sentinel_gpu_retired_pages_pending",
        "Page retirement pending reboot (1/0).",
        _attr("retired_pages_pending"),
    ),
    Series(
        "sentinel_gpu_remapped_rows_pending",
        "Row remap pending GPU reset (1/0).",
        _attr("remapped_rows_pending"),
    ),
    Series(
        "sentinel_gpu_remapped_rows_failure",
        "Row remapping failed (1/0).",
        _attr("remapped_rows_failure"),
    ),
    Series("sentinel_gpu_pcie_replays", "PCIe replays.", _attr("pcie_replay_count"), True),
    Series(
        "sentinel_gpu_tensor_active_ratio", "Tensor-pipe activity (GPM).", _attr("tensor_active")
    ),
    Series("sentinel_gpu_lost", "GPU fell off the bus (1/0).", _attr("lost")),
    Series(
        "sentinel_gpu_recovery_action",
        "Recovery action the driver requests (nvmlDeviceGpuRecoveryAction_t: 0 none, "
        "1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, ...).",
        _attr("recovery_action"),
    ),
    Series(
        "sentinel_gpu_reset_required",
        "The GPU needs a reset before it can be trusted again (1/0).",
        _attr("reset_required"),
    ),
    Series(
        "sentinel_gpu_nvlink_links_down",
        "NVLink links active at agent start that are down now.",
        lambda r: None if r.nvlink_links_down is None else len(r.nvlink_links_down),
    ),
)

# (family, label value, field) — one family with a label rather than one series each.
LABELLED_GPU_SERIES = (
    (
        "sentinel_gpu_ecc_errors",
        "Uncorrected/corrected ECC errors.",
        ("type", "scope"),
        (
            (("sbe", "volatile"), "ecc_sbe_volatile"),
            (("dbe", "volatile"), "ecc_dbe_volatile"),
            (("sbe", "aggregate"), "ecc_sbe_aggregate"),
            (("dbe", "aggregate"), "ecc_dbe_aggregate"),
        ),
    ),
    (
        "sentinel_gpu_retired_pages",
        "Retired framebuffer pages.",
        ("cause",),
        (
            (("sbe",), "retired_pages_sbe"),
            (("dbe",), "retired_pages_dbe"),
        ),
    ),
    (
        "sentinel_gpu_remapped_rows",
        "Remapped HBM rows.",
        ("kind",),
        (
            (("correctable",), "remapped_rows_correctable"),
            (("uncorrectable",), "remapped_rows_uncorrectable"),
        ),
    ),
    (
        "sentinel_gpu_nvlink_errors",
        "NVLink errors summed over links.",
        ("type",),
        (
            (("crc",), "nvlink_crc_errors"),
            (("replay",), "nvlink_replay_errors"),
            (("recovery",), "nvlink_recovery_errors"),
        ),
    ),
)

READING_FIELDS = tuple(
    f.name
    for f in fields(GpuReading)
    if f.name not in ("index", "uuid", "name", "pci_bus_id", "lost", "processes")
)


class AgentCollector(Collector):
    """Renders the monitor's latest snapshot; `extra` adds families owned by other parts."""

    def __init__(
        self,
        node_id: str,
        monitor: NodeMonitor,
        extra: Callable[[], Iterator[Metric]] | None = None,
        dcgm_names: DcgmNaming = "legacy",
    ) -> None:
        self.node_id = node_id
        self.monitor = monitor
        self.extra = extra
        self.dcgm_names = dcgm_names

    def collect(self) -> Iterator[Metric]:
        snap = self.monitor.snapshot
        if snap is not None:
            yield from self._gpu_families(snap)
            yield from dcgm_families(
                self.node_id, snap.readings, self.monitor.xids.last, self.dcgm_names
            )
            yield from self._health_families(snap)
            yield from self._host_families(snap)
        yield from self._xid_families()
        yield from input_families(self.node_id, self.monitor)
        if self.extra is not None:
            yield from self.extra()

    def _gpu_families(self, snap: Snapshot) -> Iterator[Metric]:
        labels = ["node", "gpu"]
        info = GaugeMetricFamily(
            "sentinel_gpu_info", "GPU identity.", labels=[*labels, "uuid", "name", "pci_bus_id"]
        )
        for r in snap.readings:
            info.add_metric(
                [self.node_id, str(r.index), r.uuid or "", r.name or "", r.pci_bus_id or ""], 1
            )
        yield info
        for s in SENTINEL_GPU_SERIES:
            cls = CounterMetricFamily if s.counter else GaugeMetricFamily
            fam = cls(s.name, s.help, labels=labels)
            for r in snap.readings:
                v = s.get(r)
                if v is not None:
                    fam.add_metric([self.node_id, str(r.index)], float(v))
            yield fam
        for name, help_, extra_labels, members in LABELLED_GPU_SERIES:
            fam = CounterMetricFamily(name, help_, labels=[*labels, *extra_labels])
            for r in snap.readings:
                for label_values, attr in members:
                    v = getattr(r, attr)
                    if v is not None:
                        fam.add_metric([self.node_id, str(r.index), *label_values], float(v))
            yield fam
        throttle = GaugeMetricFamily(
            "sentinel_gpu_throttle_active",
            "Clock throttle reason active (1/0).",
            labels=[*labels, "reason"],
        )
        unavailable = GaugeMetricFamily(
            "sentinel_gpu_field_unavailable",
            "1 for each field this GPU does not report (unsupported or failed).",
            labels=[*labels, "field"],
        )
        processes = GaugeMetricFamily(
            "sentinel_gpu_process_memory_bytes",
            "Memory used by each process on the GPU.",
            labels=[*labels, "pid"],
        )
        for r in snap.readings:
            gpu = str(r.index)
            if r.throttle_reasons is not None:
                for reason, bit in THROTTLE_REASONS.items():
                    throttle.add_metric(
                        [self.node_id, gpu, reason], int(bool(r.throttle_reasons & bit))
                    )
            for f in READING_FIELDS:
                if getattr(r, f) is None:
                    unavailable.add_metric([self.node_id, gpu, f], 1)
            for p in r.processes:
                processes.add_metric(
                    [self.node_id, gpu, str(p.pid)], float(p.used_memory_bytes or 0)
                )
        yield throttle
        yield unavailable
        yield processes

    def _health_families(self, snap: Snapshot) -> Iterator[Metric]:
        gpu_verdict = GaugeMetricFamily(
            "sentinel_gpu_health_verdict",
            "1 for the GPU's current verdict.",
            labels=["node", "gpu", "verdict"],
        )
        gpu_action = GaugeMetricFamily(
            "sentinel_gpu_recommended_action",
            "1 for the action recommended for the GPU.",
            labels=["node", "gpu", "action"],
        )
        findings = GaugeMetricFamily(
            "sentinel_gpu_health_finding",
            "1 for each health rule currently firing.",
            labels=["node", "gpu", "rule", "verdict"],
        )
        for g in snap.health.gpus:
            gpu = str(g.gpu)
            for v in Verdict:
                gpu_verdict.add_metric([self.node_id, gpu, v.value], int(g.verdict == v))
            for a in Action:
                gpu_action.add_metric([self.node_id, gpu, a.value], int(g.action == a))
            for f in g.findings:
                findings.add_metric([self.node_id, gpu, f.rule, f.verdict.value], 1)
        node_verdict = GaugeMetricFamily(
            "sentinel_node_health_verdict",
            "1 for the node's current verdict.",
            labels=["node", "verdict"],
        )
        node_action = GaugeMetricFamily(
            "sentinel_node_recommended_action",
            "1 for the action recommended for the node.",
            labels=["node", "action"],
        )
        for v in Verdict:
            node_verdict.add_metric([self.node_id, v.value], int(snap.health.verdict == v))
        for a in Action:
            node_action.add_metric([self.node_id, a.value], int(snap.health.action == a))
        node_findings = GaugeMetricFamily(
            "sentinel_node_health_finding",
            "1 for each node-level health rule currently firing (NVML, GPU count, kernel log).",
            labels=["node", "rule", "verdict"],
        )
        for f in snap.health.node_findings:
            node_findings.add_metric([self.node_id, f.rule, f.verdict.value], 1)
        yield from (gpu_verdict, gpu_action, findings, node_verdict, node_action, node_findings)
        yield from node_families(self.node_id, self.monitor, snap)

    def _host_families(self, snap: Snapshot) -> Iterator[Metric]:
        h = snap.host
        if h is None:
            return
        node = [self.node_id]
        scalars = (
            ("sentinel_host_cpu_utilization_ratio", "CPU busy over all cores.", h.cpu_utilization),
            ("sentinel_host_cpus", "Logical CPUs.", h.cpu_count),
            ("sentinel_host_memory_used_bytes", "Memory in use.", h.memory_used_bytes),
            ("sentinel_host_memory_bytes", "Memory size.", h.memory_total_bytes),
            ("sentinel_host_load1", "1-minute load average.", h.load1),
            ("sentinel_host_load5", "5-minute load average.", h.load5),
            ("sentinel_host_load15", "15-minute load average.", h.load15),
        )
        for name, help_, value in scalars:
            yield family(GaugeMetricFamily, name, help_, ["node"], [(node, value)])
        yield family(
            GaugeMetricFamily,
            "sentinel_host_disk_used_bytes",
            "Disk space used.",
            ["node", "mount"],
            [([self.node_id, m], used) for m, (used, _) in h.disks.items()],
        )
        yield family(
            GaugeMetricFamily,
            "sentinel_host_disk_bytes",
            "Disk size.",
            ["node", "mount"],
            [([self.node_id, m], total) for m, (_, total) in h.disks.items()],
        )
        rx = CounterMetricFamily(
            "sentinel_host_network_receive_bytes", "Bytes received.", labels=["node", "interface"]
        )
        tx = CounterMetricFamily(
            "sentinel_host_network_transmit_bytes", "Bytes sent.", labels=["node", "interface"]
        )
        for iface, (r, t) in h.net.items():
            rx.add_metric([self.node_id, iface], r)
            tx.add_metric([self.node_id, iface], t)
        yield rx
        yield tx

    def _xid_families(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(
            "sentinel_gpu_xid_errors",
            "XID errors by code (every XID, not only the last).",
            labels=["node", "gpu", "xid"],
        )
        for (gpu, xid), n in sorted(self.monitor.xids.counts.items()):
            fam.add_metric([self.node_id, str(gpu), str(xid)], n)
        yield fam
