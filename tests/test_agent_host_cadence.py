"""Host statistics are read every `host_interval_s`, not every sweep: they are exported and
never judged, and psutil's reads cost about a third of an 8-GPU sweep."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sentinel.agent.health.judge import HealthEvaluator
from sentinel.agent.health.sources import HOST, SourceStates
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


class FailingHost(CountingHost):
    def __init__(self) -> None:
        super().__init__()
        self.failing = True

    def read(self) -> HostStats:
        if self.failing:
            raise PermissionError(13, "Permission denied", "/proc/stat")
        return super().read()


def test_a_host_that_cannot_be_read_is_a_source_down_and_the_gpus_are_still_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock, host = Clock(), FailingHost()
    gpus = SimulatedGpus(2, faults_file=tmp_path / "faults.jsonl", clock=clock)
    sources = SourceStates([HOST])
    evaluator = HealthEvaluator(HealthThresholds(), clock)
    monitor = NodeMonitor("node-0", gpus, host, evaluator, clock, sources=sources)
    with caplog.at_level(logging.INFO, "sentinel.agent.sources"):
        for _ in range(3):
            snapshot, _ = monitor.collect()
            assert snapshot.host is None and len(snapshot.readings) == 2
            clock.now += 1.0
        assert sources.down() == {
            HOST: "PermissionError: [Errno 13] Permission denied: '/proc/stat'"
        }
        assert [s.value for s in sources.family("node-0").samples] == [0.0]
        host.failing = False
        snapshot, _ = monitor.collect()
        assert snapshot.host is not None and sources.down() == {}
    assert [r.getMessage() for r in caplog.records] == [
        "source host down: PermissionError: [Errno 13] Permission denied: '/proc/stat'",
        "source host back",
    ]
