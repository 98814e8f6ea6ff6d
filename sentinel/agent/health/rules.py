"""The agent's half of the rule table: when each per-GPU rule raises and when it clears.

What a rule means (verdict, action, hold) is the catalog's (`sentinel.faults.catalog.RULES`);
this module only says how to see it in one GPU's reading and the rates derived from it. A field
a GPU does not report (`None`) never raises a rule, and never clears one either: a held finding
outlives a sensor that stopped answering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sentinel.agent.nvml.readings import GpuReading
from sentinel.config import HealthThresholds
from sentinel.faults.catalog import RECOVERY_ACTIONS, RULE_BY_NAME, RuleInfo

# NVML clocks-event (throttle) reason bits from nvml.h, named as operators know them (the
# agent's /metrics labels them so); sw_power_cap is normal under load: the driver holds power
# at the limit.
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}
THROTTLE_HW_SLOWDOWN = THROTTLE_REASONS["hw_slowdown"]
THROTTLE_SW_THERMAL = THROTTLE_REASONS["sw_thermal_slowdown"]
THROTTLE_HW_THERMAL = THROTTLE_REASONS["hw_thermal_slowdown"]
THROTTLE_HW_POWER_BRAKE = THROTTLE_REASONS["hw_power_brake_slowdown"]


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU at one sweep: its reading, the limits, and what needs history (rates, peers)."""

    r: GpuReading
    t: HealthThresholds
    pcie_rate: float | None = None  # per minute over t.rate_window_s
    nvlink_rate: float | None = None
    sbe_rate: float | None = None
    outlier: str | None = None  # why the GPU is a peer outlier this sweep (None: it is not)
    outlier_quiet: bool = True  # every peer score is back under half the limit


Check = Callable[[GpuView], bool]


@dataclass(frozen=True, slots=True)
class GpuRule:
    info: RuleInfo
    raises: Check
    detail: Callable[[GpuView], str]
    clears: Check | None = None  # None: clears when it no longer raises

    def cleared(self, v: GpuView) -> bool:
        return self.clears(v) if self.clears is not None else not self.raises(v)


def _at_least(value: float | None, limit: float) -> bool:
    return value is not None and value >= limit


def _below(value: float | None, limit: float) -> bool:
    return value is not None and value < limit


def _in_band(value: float | None, low: float, high: float) -> bool:
    return value is not None and low <= value < high


def _bit(r: GpuReading, mask: int) -> bool:
    return r.throttle_reasons is not None and bool(r.throttle_reasons & mask)


def _clear_bits(r: GpuReading, mask: int) -> bool:
    return r.throttle_reasons is not None and not r.throttle_reasons & mask


def _retired(r: GpuReading) -> int | None:
    if r.retired_pages_sbe is None and r.retired_pages_dbe is None:
        return None
    return (r.retired_pages_sbe or 0) + (r.retired_pages_dbe or 0)


def _recovery(r: GpuReading) -> str | None:
    """The rule the driver's requested recovery action raises (None: nothing, or unknown)."""
    known = RECOVERY_ACTIONS.get(r.recovery_action) if r.recovery_action is not None else None
    return None if known is None else known[1]


def _recovery_name(r: GpuReading) -> str:
    known = RECOVERY_ACTIONS.get(r.recovery_action) if r.recovery_action is not None else None
    return known[0] if known else "RESET_REQUIRED"


def _rule(
    name: str, raises: Check, detail: Callable[[GpuView], str], clears: Check | None = None
) -> GpuRule:
    return GpuRule(RULE_BY_NAME[name], raises, detail, clears)


def _temp_rules(key: str, what: str, attr: str) -> tuple[GpuRule, ...]:
    """The unhealthy and degraded rows of one temperature, each clearing `hysteresis` lower."""

    def value(v: GpuView) -> float | None:
        return getattr(v.r, attr)  # type: ignore[no-any-return]

    def limit(v: GpuView, level: str) -> float:
        return getattr(v.t, f"{key}_temp_{level}_c")  # type: ignore[no-any-return]

    def says(level: str, v: GpuView) -> str:
        return f"{what} at {value(v):.0f} C ({level} from {limit(v, level):g} C)"

    return (
        _rule(
            f"{key}_temp_unhealthy",
            lambda v: _at_least(value(v), limit(v, "unhealthy")),
            lambda v: says("unhealthy", v),
            lambda v: _below(value(v), limit(v, "unhealthy") - v.t.temp_hysteresis_c),
        ),
        _rule(
            f"{key}_temp_degraded",
            lambda v: _in_band(value(v), limit(v, "degraded"), limit(v, "unhealthy")),
            lambda v: says("degraded", v),
            lambda v: _below(value(v), limit(v, "degraded") - v.t.temp_hysteresis_c),
        ),
    )


def _rate_rule(name: str, attr: str, limit: str, what: str) -> GpuRule:
    def rate(v: GpuView) -> float | None:
        return getattr(v, attr)  # type: ignore[no-any-return]

    return _rule(
        name,
        lambda v: _at_least(rate(v), getattr(v.t, limit)),
        lambda v: (
            f"{rate(v):.1f} {what} per minute over {v.t.rate_window_s:g} s "
            f"(limit {getattr(v.t, limit):g})"
        ),
        lambda v: _below(rate(v), getattr(v.t, limit) / 2),
    )


# fmt: off
RULES: tuple[GpuRule, ...] = (
    _rule("gpu_lost", lambda v: v.r.lost,
          lambda v: "GPU stopped answering: fallen off the bus"),
    _rule("recovery_gpu_reset",
          lambda v: _recovery(v.r) == "recovery_gpu_reset" or v.r.reset_required is True,
          lambda v: f"the driver requests recovery {_recovery_name(v.r)}: reset the GPU",
          lambda v: v.r.recovery_action is not None and _recovery(v.r) is None
          and v.r.reset_required is not True),
    _rule("recovery_node_reboot", lambda v: _recovery(v.r) == "recovery_node_reboot",
          lambda v: f"the driver requests recovery {_recovery_name(v.r)}: reboot the node",
          lambda v: v.r.recovery_action is not None and _recovery(v.r) is None),
    _rule("recovery_drain", lambda v: _recovery(v.r) == "recovery_drain",
          lambda v: f"the driver requests recovery {_recovery_name(v.r)}: drain the node",
          lambda v: v.r.recovery_action is not None and _recovery(v.r) is None),
    _rule("ecc_dbe_volatile", lambda v: _at_least(v.r.ecc_dbe_volatile, 1),
          lambda v: f"{v.r.ecc_dbe_volatile} double-bit ECC error(s) since the last GPU reset",
          lambda v: _below(v.r.ecc_dbe_volatile, 1)),
    _rule("ecc_dbe_aggregate",
          lambda v: not _at_least(v.r.ecc_dbe_volatile, 1)
          and _at_least(v.r.ecc_dbe_aggregate, v.t.dbe_aggregate_degraded),
          lambda v: f"{v.r.ecc_dbe_aggregate} double-bit ECC error(s) over the GPU's lifetime"),
    _rule("retired_pages_limit", lambda v: _at_least(_retired(v.r), v.t.retired_pages_unhealthy),
          lambda v: f"{_retired(v.r)} retired pages (limit {v.t.retired_pages_unhealthy})",
          lambda v: _below(_retired(v.r), v.t.retired_pages_unhealthy)),
    _rule("retired_pages_pending", lambda v: v.r.retired_pages_pending is True,
          lambda v: "page retirement pending: takes effect at the next GPU reset",
          lambda v: v.r.retired_pages_pending is False),
    _rule("row_remap_failure", lambda v: v.r.remapped_rows_failure is True,
          lambda v: "row remapping failed: no spare rows left in a memory bank",
          lambda v: v.r.remapped_rows_failure is False),
    _rule("row_remap_pending", lambda v: v.r.remapped_rows_pending is True,
          lambda v: "row remapping pending: takes effect at the next GPU reset",
          lambda v: v.r.remapped_rows_pending is False),
    _rule("remapped_rows_uncorrectable",
          lambda v: _at_least(v.r.remapped_rows_uncorrectable,
                              v.t.remapped_rows_uncorrectable_degraded),
          lambda v: f"{v.r.remapped_rows_uncorrectable} row(s) remapped after uncorrectable "
          "errors",
          lambda v: _below(v.r.remapped_rows_uncorrectable,
                           v.t.remapped_rows_uncorrectable_degraded)),
    *_temp_rules("gpu", "GPU", "temp_gpu_c"),
    *_temp_rules("mem", "HBM", "temp_mem_c"),
    _rule("hw_slowdown",
          lambda v: _bit(v.r, THROTTLE_HW_SLOWDOWN)
          and not _bit(v.r, THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE),
          lambda v: "hardware slowdown: clocks cut by half or more (power or sensor fault)",
          lambda v: _clear_bits(v.r, THROTTLE_HW_SLOWDOWN)),
    _rule("hw_thermal_slowdown", lambda v: _bit(v.r, THROTTLE_HW_THERMAL),
          lambda v: "hardware thermal slowdown: the GPU is overheating, check its cooling",
          lambda v: _clear_bits(v.r, THROTTLE_HW_THERMAL)),
    _rule("hw_power_brake", lambda v: _bit(v.r, THROTTLE_HW_POWER_BRAKE),
          lambda v: "hardware power brake asserted: check the node's power delivery",
          lambda v: _clear_bits(v.r, THROTTLE_HW_POWER_BRAKE)),
    _rule("sw_thermal_slowdown", lambda v: _bit(v.r, THROTTLE_SW_THERMAL),
          lambda v: "software thermal slowdown: the driver lowers clocks to cool the GPU",
          lambda v: _clear_bits(v.r, THROTTLE_SW_THERMAL)),
    _rate_rule("ecc_sbe_rate", "sbe_rate", "sbe_rate_degraded", "corrected ECC errors"),
    _rate_rule("pcie_replay_rate", "pcie_rate", "pcie_replay_rate_degraded", "PCIe replays"),
    _rate_rule("nvlink_error_rate", "nvlink_rate", "nvlink_error_rate_degraded",
               "NVLink CRC + replay errors"),
    _rule("nvlink_down", lambda v: bool(v.r.nvlink_links_down),
          lambda v: f"NVLink link(s) {', '.join(map(str, v.r.nvlink_links_down or ()))} down "
          "since start",
          lambda v: v.r.nvlink_links_down == ()),
    _rule("peer_outlier", lambda v: v.outlier is not None,
          lambda v: f"odd one out among the node's GPUs: {v.outlier}",
          lambda v: v.outlier_quiet),
)
# fmt: on
