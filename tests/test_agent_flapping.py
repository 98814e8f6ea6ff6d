"""Hold-down and hysteresis under flapping input (property-based, hypothesis).

A flap storm is a signal toggling between faulty and fine with quiet stretches shorter than its
rule's hold; storms are separated by quiet longer than the hold. Whatever the storms look like,
the node's verdict leaves healthy exactly once per storm and never goes faulty -> healthy ->
faulty inside one, so the coordinator sees one incident per storm and never an evict/return
loop. The node monitor and evaluator are the agent's own; the GPUs are a scripted backend (the
seam every GPU source implements), because the property is about time, not about NVML.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.monitor import NodeMonitor
from sentinel.agent.nvml.readings import GpuBackend, GpuReading, XidEvent
from sentinel.config import HealthThresholds
from sentinel.faults.catalog import RULES, rule
from sentinel.protocol import EventKind

POLL_S = 30.0  # the holds are minutes: a coarse poll keeps the property test quick
FINE = GpuReading(
    index=0,
    temp_gpu_c=55.0,
    temp_mem_c=60.0,
    power_w=500.0,
    util_gpu_pct=95,
    sm_clock_mhz=1980,
    throttle_reasons=0,
    nvlink_links_down=(),
    recovery_action=0,
    reset_required=False,
)

# Quiet this long clears every rule a storm can raise (its own, and peer_outlier beside it).
SETTLE_POLLS = int(max(r.hold_s for r in RULES) // POLL_S) + 2

# Signals that can flap: the faulty reading, and the rule whose hold governs it.
FLAPS = {
    "hot": ({"temp_gpu_c": 96.0}, "gpu_temp_unhealthy"),
    "warm": ({"temp_gpu_c": 87.0}, "gpu_temp_degraded"),  # degraded, never unhealthy
    "hw_slowdown": ({"throttle_reasons": 0x8}, "hw_slowdown"),
    "link": ({"nvlink_links_down": (2,)}, "nvlink_down"),
    "reset": ({"recovery_action": 1}, "recovery_gpu_reset"),
    "lost": ({"lost": True}, "gpu_lost"),
}


class ScriptedGpus(GpuBackend):
    def __init__(self, gpus: int) -> None:
        self.readings = [replace(FINE, index=i) for i in range(gpus)]

    def gpu_count(self) -> int:
        return len(self.readings)

    def read(self, index: int) -> GpuReading:
        return self.readings[index]

    def drain_xids(self) -> list[XidEvent]:
        return []


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@st.composite
def storms(draw: st.DrawFn) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """Storms of (signal, gpu, [(polls faulty, polls fine), ...])."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        signal = draw(st.sampled_from(sorted(FLAPS)))
        hold_polls = int(rule(FLAPS[signal][1]).hold_s // POLL_S)
        segments = draw(
            st.lists(
                st.tuples(st.integers(1, 6), st.integers(1, max(1, hold_polls - 1))),
                min_size=1,
                max_size=8,
            )
        )
        out.append((signal, draw(st.integers(0, 3)), segments))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(storms())
def test_one_verdict_episode_per_flap_storm(
    plan: list[tuple[str, int, list[tuple[int, int]]]],
) -> None:
    clock = Clock()
    gpus = ScriptedGpus(4)
    monitor = NodeMonitor(
        "node-0", gpus, None, HealthEvaluator(HealthThresholds(), clock), clock, expected_gpus=4
    )
    verdicts: list[str] = []
    said: list[tuple[str, str]] = []  # the node's (verdict, action) as its health events moved it

    def poll() -> None:
        _, events = monitor.collect()
        for e in events:
            now = (e.payload.verdict, e.payload.action)
            if e.kind is EventKind.NODE_HEALTH and now != (said[-1] if said else None):
                said.append(now)
                verdicts.append(e.payload.verdict)
        clock.now += POLL_S

    poll()
    assert verdicts == ["healthy"]
    for signal, gpu, segments in plan:
        faulty, _ = FLAPS[signal]
        start = len(verdicts)
        for on, off in segments:
            gpus.readings[gpu] = replace(FINE, index=gpu, **faulty)  # type: ignore[arg-type]
            for _ in range(on):
                poll()
            gpus.readings[gpu] = replace(FINE, index=gpu)
            for _ in range(off):
                poll()
        for _ in range(SETTLE_POLLS):
            poll()
        storm = verdicts[start:]
        # One way out of healthy and one way back: one incident, and the node is not returned
        # to the job before the storm is over. Unhealthy (what evicts) is entered at most once.
        assert storm[-1] == "healthy" and storm.count("healthy") == 1, storm
        assert storm.count("unhealthy") <= 1, storm
