"""dcgm-exporter-compatible GPU series, under either of its two namings.

dcgm-exporter up to 4.8 names its default metrics after DCGM's old field names, in the fields'
old units (MHz, percent, MiB, mJ) with a `Hostname` label. dcgm-exporter 4.9 (DCGM 4.7) names
them after DCGM's canonical fields, 23 of ours renamed and 7 of those in base units (Hz, ratio,
bytes, J), and labels the node `hostname` (dcgm-exporter #655). Dashboards built for one break
on the other, so the agent serves either, or both while an operator moves theirs over
(`agent.dcgm_names`). `promql()` writes one expression that reads whichever an exporter serves.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

from sentinel.agent.nvml.readings import GpuReading
from sentinel.config import DcgmNaming

MIB = 1024 * 1024

LEGACY_HOST, CURRENT_HOST = "Hostname", "hostname"


@dataclass(frozen=True)
class Units:
    """A reading's unit under each naming: the reading times `legacy_scale` is in `legacy`,
    times `current_scale` in `current`."""

    legacy: str = ""
    current: str = ""
    legacy_scale: float = 1.0
    current_scale: float = 1.0


@dataclass(frozen=True)
class DcgmField:
    legacy: str
    current: str
    help: str
    attr: str  # the GpuReading field; "" for the XID, which the agent's XID log keeps
    units: Units = Units()

    def name(self, current: bool) -> str:
        return self.current if current else self.legacy

    def help_for(self, current: bool) -> str:
        unit = self.units.current if current else self.units.legacy
        return f"{self.help} (in {unit})." if unit else f"{self.help}."

    def value(self, r: GpuReading, current: bool) -> float | None:
        v = getattr(r, self.attr)
        scale = self.units.current_scale if current else self.units.legacy_scale
        return None if v is None else float(v) * scale


CELSIUS, WATTS = Units("C", "C"), Units("W", "W")
MJ_TO_J = Units("mJ", "J", current_scale=1e-3)
MHZ_TO_HZ = Units("MHz", "Hz", current_scale=1e6)
PERCENT_TO_RATIO = Units("%", "ratio", current_scale=0.01)
MIB_TO_BYTES = Units("MiB", "bytes", legacy_scale=1 / MIB)

# dcgm-exporter's default counters, and the health counters it ships commented out, as the
# agent exports them: (legacy, DCGM 4.7's canonical field identifier, help, reading[, units]),
# without the `DCGM_FI_DEV_` prefix.
_MEASURES = (
    ("GPU_TEMP", "GPU_TEMP_CELSIUS", "GPU temperature", "temp_gpu_c", CELSIUS),
    ("MEMORY_TEMP", "MEMORY_TEMP_CELSIUS", "Memory temperature", "temp_mem_c", CELSIUS),
    ("POWER_USAGE", "BOARD_POWER_WATTS", "Power draw", "power_w", WATTS),
    ("TOTAL_ENERGY_CONSUMPTION", "GPU_ENERGY_JOULES_TOTAL", "Energy", "energy_mj", MJ_TO_J),
    ("SM_CLOCK", "SM_CLOCK_HERTZ", "SM frequency", "sm_clock_mhz", MHZ_TO_HZ),
    ("MEM_CLOCK", "MEMORY_CLOCK_HERTZ", "Memory frequency", "mem_clock_mhz", MHZ_TO_HZ),
    ("GPU_UTIL", "GPU_UTIL_RATIO", "GPU utilization", "util_gpu_pct", PERCENT_TO_RATIO),
    ("MEM_COPY_UTIL", "MEMORY_UTIL_RATIO", "Memory utilization", "util_mem_pct", PERCENT_TO_RATIO),
    ("FB_USED", "FB_USED_BYTES", "Framebuffer memory used", "fb_used_bytes", MIB_TO_BYTES),
    ("FB_FREE", "FB_FREE_BYTES", "Framebuffer memory free", "fb_free_bytes", MIB_TO_BYTES),
)


def _remapped(kind: str) -> tuple[str, str, str, str]:
    return (
        f"{kind.upper()}_REMAPPED_ROWS",
        f"ROW_REMAP_{kind.upper()}_TOTAL",
        f"Rows remapped, {kind}",
        f"remapped_rows_{kind}",
    )


def _nvlink(kind: str, reading: str, what: str) -> tuple[str, str, str, str]:
    return (
        f"NVLINK_{kind}_ERROR_COUNT_TOTAL",
        f"NVLINK_{kind}_ERROR_TOTAL",
        f"NVLink {what}",
        f"nvlink_{reading}_errors",
    )


_COUNTS = (
    ("ECC_SBE_VOL_TOTAL", "ECC_SBE_VOL_TOTAL", "Volatile SBE ECC errors", "ecc_sbe_volatile"),
    ("ECC_DBE_VOL_TOTAL", "ECC_DBE_VOL_TOTAL", "Volatile DBE ECC errors", "ecc_dbe_volatile"),
    ("ECC_SBE_AGG_TOTAL", "ECC_SBE_AGG_TOTAL", "Persistent SBE ECC errors", "ecc_sbe_aggregate"),
    ("ECC_DBE_AGG_TOTAL", "ECC_DBE_AGG_TOTAL", "Persistent DBE ECC errors", "ecc_dbe_aggregate"),
    ("RETIRED_SBE", "PAGE_RETIRED_SBE_TOTAL", "Pages retired for SBEs", "retired_pages_sbe"),
    ("RETIRED_DBE", "PAGE_RETIRED_DBE_TOTAL", "Pages retired for DBEs", "retired_pages_dbe"),
    ("RETIRED_PENDING", "PAGE_RETIRED_PENDING", "Pages to retire", "retired_pages_pending"),
    _remapped("uncorrectable"),
    _remapped("correctable"),
    ("ROW_REMAP_FAILURE", "ROW_REMAP_FAILED", "Row remapping failed", "remapped_rows_failure"),
    ("PCIE_REPLAY_COUNTER", "PCIE_REPLAY_TOTAL", "PCIe retries", "pcie_replay_count"),
    ("CLOCK_THROTTLE_REASONS", "CLOCKS_EVENT_REASONS", "Clock event reasons", "throttle_reasons"),
    _nvlink("CRC_FLIT", "crc", "CRC errors"),
    _nvlink("REPLAY", "replay", "retries"),
    _nvlink("RECOVERY", "recovery", "recoveries"),
)
DCGM_FIELDS = (
    *(
        DcgmField(f"DCGM_FI_DEV_{old}", f"DCGM_FI_DEV_{new}", h, a, u)
        for old, new, h, a, u in _MEASURES
    ),
    *(DcgmField(f"DCGM_FI_DEV_{old}", f"DCGM_FI_DEV_{new}", h, a) for old, new, h, a in _COUNTS),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
        "Ratio of cycles the tensor (HMMA) pipe is active",
        "tensor_active",
    ),
)
XID = DcgmField(
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", "Value of the last XID error encountered", ""
)
BY_LEGACY: Mapping[str, DcgmField] = {f.legacy: f for f in (*DCGM_FIELDS, XID)}


def dcgm_families(
    node_id: str,
    readings: Sequence[GpuReading],
    last_xid: Mapping[int, int],
    naming: DcgmNaming,
) -> Iterator[GaugeMetricFamily]:
    """Every field under the naming (both: each field twice, one per naming). Gauges even for
    dcgm-exporter's counters: prometheus_client would append `_total` to a counter's name, and
    the name is what dashboards and alerts match on."""
    for current in _namings(naming):
        host = CURRENT_HOST if current else LEGACY_HOST
        labels = ["gpu", "UUID", "device", "modelName", host, "pci_bus_id"]
        rows = [(r, _label_values(r, node_id)) for r in readings]
        for f in DCGM_FIELDS:
            fam = GaugeMetricFamily(f.name(current), f.help_for(current), labels=labels)
            for r, values in rows:
                v = f.value(r, current)
                if v is not None:
                    fam.add_metric(values, v)
            yield fam
        xid = GaugeMetricFamily(XID.name(current), XID.help_for(current), labels=labels)
        for r, values in rows:
            xid.add_metric(values, float(last_xid.get(r.index, 0)))
        yield xid


def _label_values(r: GpuReading, node_id: str) -> list[str]:
    """dcgm-exporter's labels: gpu, UUID, device, modelName, the host, pci_bus_id."""
    return [
        str(r.index),
        r.uuid or "",
        f"nvidia{r.index}",
        r.name or "",
        node_id,
        r.pci_bus_id or "",
    ]


def _namings(naming: DcgmNaming) -> tuple[bool, ...]:
    """`current` for each naming served: False the legacy, True DCGM 4.7's."""
    return {"legacy": (False,), "dcgm-4.7": (True,), "both": (False, True)}[naming]


def promql(legacy: str, host: str = "", rest: str = "", offset: str = "") -> str:
    """One PromQL expression for a dcgm-exporter series, whichever naming its exporters serve:
    the legacy series, or DCGM 4.7's in the legacy unit and relabelled to the legacy `Hostname`
    (an exporter serving both: its legacy series, once). `host` matches the node (`=~"$node"`),
    `rest` the other labels (`gpu=~"$gpu"`), `offset` is a modifier (`offset 15m`)."""
    f = BY_LEGACY[legacy]

    def selector(name: str, host_label: str) -> str:
        matchers = ", ".join(m for m in (f"{host_label}{host}" if host else "", rest) if m)
        return name + (f"{{{matchers}}}" if matchers else "") + (f" {offset}" if offset else "")

    current = selector(f.current, CURRENT_HOST)
    factor = f.units.legacy_scale / f.units.current_scale
    if factor > 1.0:
        current = f"({current} * {factor:.15g})"
    elif factor < 1.0:
        current = f"({current} / {1 / factor:.15g})"
    # Copy `hostname` to `Hostname`, then drop `hostname`, so a GPU served under both namings
    # has one label set and `or` keeps one of its two series.
    relabelled = (
        f'label_replace(label_replace({current}, "{LEGACY_HOST}", "$1", "{CURRENT_HOST}", "(.+)"),'
        f' "{CURRENT_HOST}", "", "", "")'
    )
    return f"({selector(f.legacy, LEGACY_HOST)} or {relabelled})"
