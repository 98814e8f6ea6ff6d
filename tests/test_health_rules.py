"""Health rules row by row, the XID catalog, XID escalation in a window, node aggregation."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from sentinel.agent.health.judge import RULES, HealthEvaluator, judge
from sentinel.agent.nvml.readings import GpuReading, XidEvent
from sentinel.config import HealthThresholds
from sentinel.faults.catalog import CATALOG, describe
from sentinel.faults.catalog import RULES as CATALOG_RULES
from sentinel.protocol import Action, Verdict

H, D, U = Verdict.HEALTHY, Verdict.DEGRADED, Verdict.UNHEALTHY
T = HealthThresholds()

HEALTHY = GpuReading(
    index=0,
    uuid="GPU-0",
    temp_gpu_c=45.0,
    temp_mem_c=52.0,
    power_w=500.0,
    sm_clock_mhz=1980,
    ecc_sbe_volatile=0,
    ecc_dbe_volatile=0,
    ecc_sbe_aggregate=0,
    ecc_dbe_aggregate=0,
    retired_pages_sbe=0,
    retired_pages_dbe=0,
    retired_pages_pending=False,
    remapped_rows_correctable=0,
    remapped_rows_uncorrectable=0,
    remapped_rows_pending=False,
    remapped_rows_failure=False,
    throttle_reasons=0,
    pcie_replay_count=0,
    nvlink_crc_errors=0,
    nvlink_replay_errors=0,
    nvlink_links_down=(),
    recovery_action=0,
    reset_required=False,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# One triggering reading per rule row: (rule, changes to a healthy reading, verdict, action).
RULE_CASES: list[tuple[str, dict[str, object], Verdict, Action]] = [
    ("gpu_lost", {"lost": True}, U, Action.REBOOT_NODE),
    ("ecc_dbe_volatile", {"ecc_dbe_volatile": 1, "ecc_dbe_aggregate": 1}, U, Action.RESET_GPU),
    ("ecc_dbe_aggregate", {"ecc_dbe_aggregate": 1}, D, Action.NONE),
    ("retired_pages_limit", {"retired_pages_sbe": 40, "retired_pages_dbe": 8}, U,
     Action.DRAIN_AND_INSPECT),
    ("retired_pages_pending", {"retired_pages_pending": True}, D, Action.RESET_GPU),
    ("row_remap_failure", {"remapped_rows_failure": True}, U, Action.DRAIN_AND_INSPECT),
    ("row_remap_pending", {"remapped_rows_pending": True}, D, Action.RESET_GPU),
    ("remapped_rows_uncorrectable", {"remapped_rows_uncorrectable": 1}, D, Action.NONE),
    ("gpu_temp_unhealthy", {"temp_gpu_c": 92.0}, U, Action.DRAIN_AND_INSPECT),
    ("gpu_temp_degraded", {"temp_gpu_c": 85.0}, D, Action.NONE),
    ("mem_temp_unhealthy", {"temp_mem_c": 105.0}, U, Action.DRAIN_AND_INSPECT),
    ("mem_temp_degraded", {"temp_mem_c": 95.0}, D, Action.NONE),
    ("hw_slowdown", {"throttle_reasons": 0x8}, D, Action.DRAIN_AND_INSPECT),
    ("hw_thermal_slowdown", {"throttle_reasons": 0x8 | 0x40}, D, Action.DRAIN_AND_INSPECT),
    ("hw_power_brake", {"throttle_reasons": 0x8 | 0x80}, D, Action.DRAIN_AND_INSPECT),
    ("sw_thermal_slowdown", {"throttle_reasons": 0x20}, D, Action.NONE),
    ("recovery_gpu_reset", {"recovery_action": 1}, U, Action.RESET_GPU),
    ("recovery_node_reboot", {"recovery_action": 2}, U, Action.REBOOT_NODE),
    ("recovery_drain", {"recovery_action": 3}, U, Action.DRAIN_AND_INSPECT),
    ("nvlink_down", {"nvlink_links_down": (3,)}, U, Action.RESET_GPU),
]  # fmt: skip

# Rows that need history (rates over a window, peers): each has its own tests below.
HISTORY_RULES = {"ecc_sbe_rate", "pcie_replay_rate", "nvlink_error_rate", "peer_outlier"}


def test_every_rule_row_has_a_case() -> None:
    names = [r.info.name for r in RULES]
    assert sorted(c[0] for c in RULE_CASES) == sorted(set(names) - HISTORY_RULES)
    assert len(set(names)) == len(RULES)


def test_every_gpu_rule_is_a_catalog_rule_of_gpu_scope() -> None:
    assert {r.info.name for r in RULES} == {c.name for c in CATALOG_RULES if c.scope == "gpu"}


@pytest.mark.parametrize(("rule", "changes", "verdict", "action"), RULE_CASES)
def test_rule_row_fires_alone_with_its_verdict(
    rule: str, changes: dict[str, object], verdict: Verdict, action: Action
) -> None:
    reading = replace(HEALTHY, **changes)  # type: ignore[arg-type]
    findings = judge(reading, T)
    assert [(f.rule, f.verdict, f.action) for f in findings] == [(rule, verdict, action)]
    assert findings[0].detail


def _is_level(changes: dict[str, object]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in changes.values())


# Rows judged against a threshold (not a flag or a throttle bit): one less must not fire them.
LEVEL_CASES = [c[:2] for c in RULE_CASES if _is_level(c[1]) and "throttle_reasons" not in c[1]]


@pytest.mark.parametrize(("rule", "changes"), LEVEL_CASES)
def test_rule_row_just_below_its_limit_is_quiet(rule: str, changes: dict[str, float]) -> None:
    quieter = replace(HEALTHY, **{k: v - 1 for k, v in changes.items()})  # type: ignore[arg-type]
    assert rule not in [f.rule for f in judge(quieter, T)]


def test_healthy_reading_has_no_findings() -> None:
    assert judge(HEALTHY, T) == ()


def test_unsupported_fields_never_fire() -> None:
    assert judge(GpuReading(index=3), T) == ()


def test_sw_power_cap_is_informational() -> None:
    assert judge(replace(HEALTHY, throttle_reasons=0x4), T) == ()


def test_thermal_bands_do_not_overlap() -> None:
    rules = [f.rule for f in judge(replace(HEALTHY, temp_gpu_c=96.0), T)]
    assert rules == ["gpu_temp_unhealthy"]


def test_thresholds_are_configurable() -> None:
    strict = HealthThresholds(gpu_temp_degraded_c=70, gpu_temp_unhealthy_c=80)
    assert [f.rule for f in judge(replace(HEALTHY, temp_gpu_c=75.0), strict)] == [
        "gpu_temp_degraded"
    ]
    assert judge(replace(HEALTHY, temp_gpu_c=75.0), T) == ()


def test_lost_gpu_reads_only_as_lost() -> None:
    lost = GpuReading(index=2, uuid="GPU-2", lost=True)
    assert [f.rule for f in judge(lost, T)] == ["gpu_lost"]


# --- the XID catalog -------------------------------------------------------------------------

XID_CASES = [
    (13, D, Action.RESTART_JOB, False),
    (31, D, Action.RESTART_JOB, False),
    (43, H, Action.NONE, False),
    (45, H, Action.NONE, False),
    (48, U, Action.RESET_GPU, True),
    (61, U, Action.RESET_GPU, True),
    (62, U, Action.RESET_GPU, True),
    (63, D, Action.RESET_GPU, False),
    (64, U, Action.RESET_GPU, True),
    (68, D, Action.RESTART_JOB, True),
    (69, D, Action.RESTART_JOB, False),
    (74, U, Action.RESET_GPU, True),
    (79, U, Action.REBOOT_NODE, True),
    (92, D, Action.NONE, True),
    (94, D, Action.RESTART_JOB, True),
    (95, U, Action.RESET_GPU, True),
    (119, U, Action.REBOOT_NODE, True),
    (120, U, Action.REBOOT_NODE, True),
    (140, U, Action.RESET_GPU, True),
    (143, U, Action.RESET_GPU, True),
    (144, D, Action.RESET_GPU, True),
    (145, D, Action.RESET_GPU, True),
    (146, D, Action.RESET_GPU, True),
    (147, H, Action.NONE, False),
    (148, H, Action.NONE, False),
    (149, D, Action.RESET_GPU, True),
    (150, U, Action.RESET_GPU, True),
]


@pytest.mark.parametrize(("code", "verdict", "action", "escalates"), XID_CASES)
def test_xid_catalog_row(code: int, verdict: Verdict, action: Action, escalates: bool) -> None:
    info = describe(code)
    assert (info.code, info.verdict, info.action, info.escalates) == (
        code,
        verdict,
        action,
        escalates,
    )
    assert info.name and not info.name.startswith("Unknown")
    assert info.nvidia_action


def test_xid_catalog_has_one_row_per_code() -> None:
    codes = [info.code for info in CATALOG]
    assert len(codes) == len(set(codes))


def test_unknown_xid_is_degraded_restart_job() -> None:
    info = describe(9999)
    assert (info.code, info.verdict, info.action, info.escalates) == (
        9999,
        D,
        Action.RESTART_JOB,
        True,
    )
    assert "9999" in info.name


# --- XIDs through the evaluator: outcomes, stickiness, escalation, expiry ---------------------


def _reading(gpu: int) -> GpuReading:
    return replace(HEALTHY, index=gpu, uuid=f"GPU-{gpu}")


def _xid(gpu: int, code: int) -> XidEvent:
    return XidEvent(gpu=gpu, xid=code, uuid=f"GPU-{gpu}")


def test_xid_outcome_follows_the_catalog() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    node = ev.evaluate([_reading(0), _reading(1)], [_xid(1, 79)])
    (outcome,) = node.xids
    assert (outcome.gpu, outcome.xid, outcome.uuid) == (1, 79, "GPU-1")
    assert (outcome.verdict, outcome.action, outcome.repeats_in_window) == (
        U,
        Action.REBOOT_NODE,
        1,
    )
    assert outcome.name == "GPU has fallen off the bus"
    assert not outcome.escalated
    assert [g.verdict for g in node.gpus] == [H, U]
    assert node.gpus[1].findings[0].rule == "xid_79"


def test_repeats_within_the_window_escalate_to_inspection() -> None:
    clock = FakeClock()
    ev = HealthEvaluator(T, clock=clock)
    actions = []
    for _ in range(3):
        node = ev.evaluate([_reading(0)], [_xid(0, 48)])
        actions.append((node.xids[0].action, node.xids[0].repeats_in_window))
        clock.now += 600
    assert actions == [
        (Action.RESET_GPU, 1),
        (Action.RESET_GPU, 2),
        (Action.DRAIN_AND_INSPECT, 3),
    ]
    assert node.xids[0].escalated and node.xids[0].verdict is U
    assert node.action is Action.DRAIN_AND_INSPECT
    assert "escalated" in node.gpus[0].findings[0].detail


def test_escalation_threshold_is_configurable() -> None:
    ev = HealthEvaluator(HealthThresholds(xid_escalate_after=2), clock=FakeClock())
    ev.evaluate([], [_xid(0, 79)])
    node = ev.evaluate([], [_xid(0, 79)])
    assert node.xids[0].action is Action.DRAIN_AND_INSPECT


def test_repeats_spread_beyond_the_window_do_not_escalate() -> None:
    clock = FakeClock()
    ev = HealthEvaluator(T, clock=clock)
    for _ in range(3):
        node = ev.evaluate([_reading(0)], [_xid(0, 48)])
        clock.now += 2000  # window 3600 s: at most two in any window
    assert node.xids[0].repeats_in_window == 2
    assert node.xids[0].action is Action.RESET_GPU


def test_same_xid_on_another_gpu_counts_separately() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    ev.evaluate([], [_xid(0, 48), _xid(1, 48)])
    node = ev.evaluate([], [_xid(0, 48), _xid(1, 48)])
    assert [o.repeats_in_window for o in node.xids] == [2, 2]
    node = ev.evaluate([], [_xid(0, 48)])
    assert node.xids[0].action is Action.DRAIN_AND_INSPECT
    assert [g.action for g in node.gpus] == [Action.DRAIN_AND_INSPECT, Action.RESET_GPU]


def test_application_xids_do_not_escalate() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    for _ in range(5):
        node = ev.evaluate([_reading(0)], [_xid(0, 13)])
    assert (node.xids[0].verdict, node.xids[0].action) == (D, Action.RESTART_JOB)
    assert node.xids[0].repeats_in_window == 5


def test_fatal_xid_verdict_sticks_until_the_window_passes() -> None:
    clock = FakeClock()
    ev = HealthEvaluator(T, clock=clock)
    ev.evaluate([_reading(0)], [_xid(0, 79)])
    clock.now += 3599
    node = ev.evaluate([_reading(0)], [])
    assert node.xids == ()
    assert (node.gpus[0].verdict, node.gpus[0].action) == (U, Action.REBOOT_NODE)
    clock.now += 1
    node = ev.evaluate([_reading(0)], [])
    assert (node.verdict, node.action, node.gpus[0].findings) == (H, Action.NONE, ())


def test_escalation_sticks_and_then_expires() -> None:
    clock = FakeClock()
    ev = HealthEvaluator(HealthThresholds(xid_escalate_after=2, xid_window_s=100), clock=clock)
    ev.evaluate([_reading(0)], [_xid(0, 95)])
    ev.evaluate([_reading(0)], [_xid(0, 95)])
    clock.now += 50
    assert ev.evaluate([_reading(0)], []).action is Action.DRAIN_AND_INSPECT
    clock.now += 100
    assert ev.evaluate([_reading(0)], []).action is Action.NONE
    node = ev.evaluate([_reading(0)], [_xid(0, 95)])  # a fresh window
    assert (node.xids[0].repeats_in_window, node.action) == (1, Action.RESET_GPU)


def test_informational_xid_leaves_the_gpu_healthy() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    node = ev.evaluate([_reading(0)], [_xid(0, 45)])
    assert (node.xids[0].verdict, node.verdict, node.findings) == (H, H, ())


def test_xid_for_a_gpu_without_a_reading_still_counts() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    node = ev.evaluate([_reading(0)], [_xid(5, 48)])
    assert [(g.gpu, g.uuid, g.verdict) for g in node.gpus] == [(0, "GPU-0", H), (5, "GPU-5", U)]
    assert node.unhealthy_gpus == [5]


# --- node aggregation ------------------------------------------------------------------------


def test_node_verdict_is_the_worst_gpu_and_the_strongest_action() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    readings = [
        replace(_reading(0), temp_gpu_c=88.0),  # degraded, none
        replace(_reading(1), ecc_dbe_volatile=1, ecc_dbe_aggregate=1),  # unhealthy, reset_gpu
        _reading(2),
        _reading(3),
    ]
    node = ev.evaluate(readings, [_xid(3, 79)])  # unhealthy, reboot_node
    assert [(g.gpu, g.verdict, g.action) for g in node.gpus] == [
        (0, D, Action.NONE),
        (1, U, Action.RESET_GPU),
        (2, H, Action.NONE),
        (3, U, Action.REBOOT_NODE),
    ]
    assert (node.verdict, node.action) == (U, Action.REBOOT_NODE)
    assert node.unhealthy_gpus == [1, 3]
    assert [f.detail.split(":")[0] for f in node.findings] == ["gpu 0", "gpu 1", "gpu 3"]


def test_degraded_node_when_only_degraded_gpus() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    node = ev.evaluate([replace(_reading(0), remapped_rows_pending=True), _reading(1)], [])
    assert (node.verdict, node.action, node.unhealthy_gpus) == (D, Action.RESET_GPU, [])


def test_all_healthy_node() -> None:
    ev = HealthEvaluator(T, clock=FakeClock())
    node = ev.evaluate([_reading(i) for i in range(8)], [])
    assert (node.verdict, node.action, node.findings) == (H, Action.NONE, ())
    assert len(node.gpus) == 8 and all(g.findings == () for g in node.gpus)


def test_the_healthy_base_reading_sets_every_judged_field() -> None:
    judged = {f.name for f in fields(GpuReading)} - {
        "index",
        "uuid",
        "name",
        "pci_bus_id",
        "lost",
        "power_limit_w",
        "energy_mj",
        "mem_clock_mhz",
        "util_gpu_pct",
        "util_mem_pct",
        "fb_used_bytes",
        "fb_free_bytes",
        "fb_total_bytes",
        "nvlink_recovery_errors",
        "tensor_active",
        "processes",
    }
    assert all(getattr(HEALTHY, name) is not None for name in judged)
