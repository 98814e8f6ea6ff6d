"""Host statistics are read every `host_interval_s`, not every sweep: they are exported and
never judged, and psutil's reads cost about a third of an 8-GPU sweep."""

from __future__ import annotations

from pathlib import Path

from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.host import HostStats
from sentinel.agent.monitor import NodeMonitor
from sentinel.agent.nvml.sim import SimulatedGpus
from sentinel.config import HealthThresholds


class CountingHost:
    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> HostStats:
        self.reads += 1
        return HostStats(
            cpu_utilization=0.5,
            cpu_count=4,
            memory_used_bytes=self.reads,
            memory_total_bytes=1 << 30,
            load1=1.0,
            load5=1.0,
            load15=1.0,
        )


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_sweeps_carry_the_last_host_stats_until_the_interval_has_passed(tmp_path: Path) -> None:
    clock, host = Clock(), CountingHost()
    gpus = SimulatedGpus(2, faults_file=tmp_path / "faults.jsonl", clock=clock)
    evaluator = HealthEvaluator(HealthThresholds(), clock)
    monitor = NodeMonitor("node-0", gpus, host, evaluator, clock, host_interval_s=5.0)
    seen = []
    for _ in range(12):  # 1 s sweeps: read at 0, 5 and 10 s
        snapshot, _ = monitor.collect()
        assert snapshot.host is not None
        seen.append(snapshot.host.memory_used_bytes)
        clock.now += 1.0
    assert host.reads == 3 and seen == [1] * 5 + [2] * 5 + [3] * 2
    clock.now -= 3600.0  # the wall clock stepped back: read now, not in an hour
    monitor.collect()
    assert host.reads == 4
