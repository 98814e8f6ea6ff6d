"""Health rules: readings and XIDs in, a verdict and a recommended action per GPU and per node out.

The rules are a table (`RULES`): each row names a condition on one `GpuReading`, the verdict and
action it implies, and how to describe what it saw. A field a GPU does not report (`None`) never
fires a rule. XIDs are judged by the fault catalog (`sentinel.faults.catalog`) and are stateful: the evaluator
remembers each (gpu, xid) for `xid_window_s`, keeps the GPU's verdict for that long after the last
occurrence, and escalates to drain_and_inspect when the same fault repeats `xid_escalate_after`
times within the window. Pure logic: no I/O, and the clock is injected.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sentinel.agent.readings import GpuReading, XidEvent
from sentinel.config import HealthThresholds
from sentinel.faults.catalog import describe
from sentinel.protocol import ACTION_SEVERITY, VERDICT_SEVERITY, Action, Finding, Verdict

# NVML clocks-event (throttle) reason bits.
THROTTLE_SW_POWER_CAP = 0x4  # normal under load: the driver holds power at the limit
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80

_H, _D, _U = Verdict.HEALTHY, Verdict.DEGRADED, Verdict.UNHEALTHY


@dataclass(frozen=True, slots=True)
class HealthRule:
    name: str
    verdict: Verdict
    action: Action
    applies: Callable[[GpuReading, HealthThresholds], bool]
    detail: Callable[[GpuReading, HealthThresholds], str]


def _at_least(value: float | None, limit: float) -> bool:
    return value is not None and value >= limit


def _in_band(value: float | None, low: float, high: float) -> bool:
    return value is not None and low <= value < high


def _bit(r: GpuReading, mask: int) -> bool:
    return r.throttle_reasons is not None and bool(r.throttle_reasons & mask)


def _retired(r: GpuReading) -> int | None:
    if r.retired_pages_sbe is None and r.retired_pages_dbe is None:
        return None
    return (r.retired_pages_sbe or 0) + (r.retired_pages_dbe or 0)


# fmt: off
RULES: tuple[HealthRule, ...] = (
    HealthRule(
        "gpu_lost", _U, Action.REBOOT_NODE,
        lambda r, t: r.lost,
        lambda r, t: "GPU stopped answering: fallen off the bus",
    ),
    HealthRule(
        "ecc_dbe_volatile", _U, Action.RESET_GPU,
        lambda r, t: _at_least(r.ecc_dbe_volatile, 1),
        lambda r, t: f"{r.ecc_dbe_volatile} double-bit ECC error(s) since the last GPU reset",
    ),
    HealthRule(
        "ecc_dbe_aggregate", _D, Action.NONE,
        lambda r, t: not _at_least(r.ecc_dbe_volatile, 1)
        and _at_least(r.ecc_dbe_aggregate, t.dbe_aggregate_degraded),
        lambda r, t: f"{r.ecc_dbe_aggregate} double-bit ECC error(s) over the GPU's lifetime",
    ),
    HealthRule(
        "retired_pages_limit", _U, Action.DRAIN_AND_INSPECT,
        lambda r, t: _at_least(_retired(r), t.retired_pages_unhealthy),
        lambda r, t: f"{_retired(r)} retired pages (limit {t.retired_pages_unhealthy})",
    ),
    HealthRule(
        "retired_pages_pending", _D, Action.RESET_GPU,
        lambda r, t: r.retired_pages_pending is True,
        lambda r, t: "page retirement pending: takes effect at the next GPU reset",
    ),
    HealthRule(
        "row_remap_failure", _U, Action.DRAIN_AND_INSPECT,
        lambda r, t: r.remapped_rows_failure is True,
        lambda r, t: "row remapping failed: no spare rows left in a memory bank",
    ),
    HealthRule(
        "row_remap_pending", _D, Action.RESET_GPU,
        lambda r, t: r.remapped_rows_pending is True,
        lambda r, t: "row remapping pending: takes effect at the next GPU reset",
    ),
    HealthRule(
        "remapped_rows_uncorrectable", _D, Action.NONE,
        lambda r, t: _at_least(
            r.remapped_rows_uncorrectable, t.remapped_rows_uncorrectable_degraded
        ),
        lambda r, t: f"{r.remapped_rows_uncorrectable} row(s) remapped after uncorrectable errors",
    ),
    HealthRule(
        "gpu_temp_unhealthy", _U, Action.DRAIN_AND_INSPECT,
        lambda r, t: _at_least(r.temp_gpu_c, t.gpu_temp_unhealthy_c),
        lambda r, t: f"GPU at {r.temp_gpu_c:.0f} C (unhealthy from {t.gpu_temp_unhealthy_c:g} C)",
    ),
    HealthRule(
        "gpu_temp_degraded", _D, Action.NONE,
        lambda r, t: _in_band(r.temp_gpu_c, t.gpu_temp_degraded_c, t.gpu_temp_unhealthy_c),
        lambda r, t: f"GPU at {r.temp_gpu_c:.0f} C (degraded from {t.gpu_temp_degraded_c:g} C)",
    ),
    HealthRule(
        "mem_temp_unhealthy", _U, Action.DRAIN_AND_INSPECT,
        lambda r, t: _at_least(r.temp_mem_c, t.mem_temp_unhealthy_c),
        lambda r, t: f"HBM at {r.temp_mem_c:.0f} C (unhealthy from {t.mem_temp_unhealthy_c:g} C)",
    ),
    HealthRule(
        "mem_temp_degraded", _D, Action.NONE,
        lambda r, t: _in_band(r.temp_mem_c, t.mem_temp_degraded_c, t.mem_temp_unhealthy_c),
        lambda r, t: f"HBM at {r.temp_mem_c:.0f} C (degraded from {t.mem_temp_degraded_c:g} C)",
    ),
    HealthRule(
        "hw_slowdown", _D, Action.DRAIN_AND_INSPECT,
        lambda r, t: _bit(r, THROTTLE_HW_SLOWDOWN)
        and not _bit(r, THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE),
        lambda r, t: "hardware slowdown: clocks cut by half or more (power or sensor fault)",
    ),
    HealthRule(
        "hw_thermal_slowdown", _D, Action.DRAIN_AND_INSPECT,
        lambda r, t: _bit(r, THROTTLE_HW_THERMAL),
        lambda r, t: "hardware thermal slowdown: the GPU is overheating, check its cooling",
    ),
    HealthRule(
        "hw_power_brake", _D, Action.DRAIN_AND_INSPECT,
        lambda r, t: _bit(r, THROTTLE_HW_POWER_BRAKE),
        lambda r, t: "hardware power brake asserted: check the node's power delivery",
    ),
    HealthRule(
        "sw_thermal_slowdown", _D, Action.NONE,
        lambda r, t: _bit(r, THROTTLE_SW_THERMAL),
        lambda r, t: "software thermal slowdown: the driver lowers clocks to cool the GPU",
    ),
    HealthRule(
        "ecc_sbe_volatile_high", _D, Action.NONE,
        lambda r, t: _at_least(r.ecc_sbe_volatile, t.sbe_volatile_degraded),
        lambda r, t: f"{r.ecc_sbe_volatile} corrected single-bit ECC errors since the last reset",
    ),
    HealthRule(
        "pcie_replays", _D, Action.DRAIN_AND_INSPECT,
        lambda r, t: _at_least(r.pcie_replay_count, t.pcie_replay_degraded),
        lambda r, t: f"{r.pcie_replay_count} PCIe replays since driver load: a marginal link",
    ),
    HealthRule(
        "nvlink_crc_errors", _D, Action.RESET_GPU,
        lambda r, t: _at_least(r.nvlink_crc_errors, t.nvlink_crc_degraded),
        lambda r, t: f"{r.nvlink_crc_errors} NVLink CRC errors: links need retraining",
    ),
)
# fmt: on


def judge(reading: GpuReading, thresholds: HealthThresholds) -> tuple[Finding, ...]:
    """The findings of every rule row that fires on one reading (stateless)."""
    return tuple(
        Finding(
            rule=rule.name,
            verdict=rule.verdict,
            action=rule.action,
            detail=rule.detail(reading, thresholds),
        )
        for rule in RULES
        if rule.applies(reading, thresholds)
    )


@dataclass(frozen=True, slots=True)
class XidOutcome:
    gpu: int
    uuid: str | None
    xid: int
    name: str
    verdict: Verdict
    action: Action
    repeats_in_window: int
    escalated: bool = False  # repeated often enough to recommend hardware inspection


@dataclass(frozen=True, slots=True)
class GpuHealth:
    gpu: int
    uuid: str | None
    verdict: Verdict
    action: Action
    findings: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class NodeHealth:
    verdict: Verdict
    action: Action
    gpus: tuple[GpuHealth, ...]
    findings: tuple[Finding, ...]  # every GPU's findings, each detail prefixed with its GPU
    xids: tuple[XidOutcome, ...]  # the XIDs of this evaluation, judged

    @property
    def unhealthy_gpus(self) -> list[int]:
        return [g.gpu for g in self.gpus if g.verdict is Verdict.UNHEALTHY]


def worst_verdict(findings: Iterable[Finding]) -> Verdict:
    return max((f.verdict for f in findings), key=VERDICT_SEVERITY.__getitem__, default=_H)


def strongest_action(findings: Iterable[Finding]) -> Action:
    return max((f.action for f in findings), key=ACTION_SEVERITY.__getitem__, default=Action.NONE)


class HealthEvaluator:
    """Judges one sweep at a time, remembering XIDs across sweeps (see the module docstring)."""

    def __init__(
        self, thresholds: HealthThresholds, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._thresholds = thresholds
        self._clock = clock
        self._seen: dict[tuple[int, int], deque[float]] = {}  # (gpu, xid) -> arrival times
        self._last: dict[tuple[int, int], XidOutcome] = {}  # (gpu, xid) -> latest judgement

    @property
    def thresholds(self) -> HealthThresholds:
        return self._thresholds

    @thresholds.setter
    def thresholds(self, thresholds: HealthThresholds) -> None:
        """A config reload: the XID memory stays, the new limits apply from the next sweep."""
        self._thresholds = thresholds

    def evaluate(self, readings: Sequence[GpuReading], xids: Sequence[XidEvent]) -> NodeHealth:
        now = self._clock()
        self._expire(now)
        outcomes = tuple(self._record(event, now) for event in xids)
        uuids = {o.gpu: o.uuid for o in self._last.values()}
        uuids.update({r.index: r.uuid for r in readings})
        by_gpu = {r.index: judge(r, self._thresholds) for r in readings}
        for (gpu, _), outcome in sorted(self._last.items()):
            finding = self._xid_finding(outcome)
            if finding is not None:
                by_gpu[gpu] = (*by_gpu.get(gpu, ()), finding)
        gpus = tuple(
            GpuHealth(gpu, uuids.get(gpu), worst_verdict(fs), strongest_action(fs), fs)
            for gpu, fs in sorted(by_gpu.items())
        )
        findings = tuple(
            f.model_copy(update={"detail": f"gpu {g.gpu}: {f.detail}"})
            for g in gpus
            for f in g.findings
        )
        return NodeHealth(
            worst_verdict(findings), strongest_action(findings), gpus, findings, outcomes
        )

    def _record(self, event: XidEvent, now: float) -> XidOutcome:
        key = (event.gpu, event.xid)
        seen = self._seen.setdefault(key, deque())
        seen.append(now)
        info = describe(event.xid)
        escalate = info.escalates and len(seen) >= self._thresholds.xid_escalate_after
        outcome = XidOutcome(
            gpu=event.gpu,
            uuid=event.uuid,
            xid=event.xid,
            name=info.name,
            verdict=_U if escalate else info.verdict,
            action=Action.DRAIN_AND_INSPECT if escalate else info.action,
            repeats_in_window=len(seen),
            escalated=escalate,
        )
        self._last[key] = outcome
        return outcome

    def _expire(self, now: float) -> None:
        horizon = now - self._thresholds.xid_window_s
        for key in list(self._seen):
            seen = self._seen[key]
            while seen and seen[0] <= horizon:
                seen.popleft()
            if not seen:
                del self._seen[key]
                del self._last[key]

    def _xid_finding(self, o: XidOutcome) -> Finding | None:
        if o.verdict is _H and o.action is Action.NONE:
            return None
        window = self._thresholds.xid_window_s
        detail = f"Xid {o.xid} ({o.name}) seen {o.repeats_in_window}x in {window:g} s"
        if o.escalated:
            detail += ": repeated, escalated to hardware inspection"
        return Finding(rule=f"xid_{o.xid}", verdict=o.verdict, action=o.action, detail=detail)
