"""Peer outliers, unit by unit: a 1-in-8 outlier is flagged on its second poll, not its first,
on every metric; eight GPUs that merely differ a little are not; idle GPUs are not compared on
clocks or power. (The fleet-day false-flag rate is benchmarks/agent_outliers.py.)"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sentinel.agent.outliers import PeerOutliers, temp_at_power
from sentinel.agent.readings import GpuReading
from sentinel.config import HealthThresholds

T = HealthThresholds()


def node(rng: random.Random, **odd: float) -> list[GpuReading]:
    """Eight busy GPUs with a little spread; `odd` changes GPU 5 (field=new value)."""
    out = []
    for g in range(8):
        power = 620 + rng.gauss(0, 15)
        r = GpuReading(
            index=g, util_gpu_pct=97, power_w=power, temp_gpu_c=30 + 0.045 * power
            + rng.gauss(0, 0.8), sm_clock_mhz=1980 - 15 * rng.randint(0, 2),
        )  # fmt: skip
        out.append(replace(r, **odd) if g == 5 else r)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize(
    "odd",
    [{"temp_gpu_c": 70.0}, {"sm_clock_mhz": 1600}, {"power_w": 400.0}],
    ids=["hot", "clocks", "power"],
)
def test_a_one_in_eight_outlier_is_flagged_on_its_second_poll(odd: dict[str, float]) -> None:
    rng = random.Random(1)
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    for _ in range(20):
        assert all(why is None for why, _ in d.update(node(rng), {}).values())
    first = d.update(node(rng, **odd), {})
    second = d.update(node(rng, **odd), {})
    assert first[5][0] is None  # one odd sample is not a finding
    assert second[5][0] is not None and not second[5][1]
    assert all(second[g][0] is None for g in range(8) if g != 5)


def test_an_error_rate_outlier_is_flagged_too() -> None:
    rng = random.Random(2)
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    rates = {g: 0.0 for g in range(8)} | {5: 150.0}
    d.update(node(rng), rates)
    assert "error rate" in (d.update(node(rng), rates)[5][0] or "")


def test_a_quiet_node_raises_nothing_over_an_hour() -> None:
    rng = random.Random(3)
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    for _ in range(3600):
        assert all(why is None for why, _ in d.update(node(rng), {}).values())


def test_idle_gpus_are_not_compared_on_clocks_or_power() -> None:
    rng = random.Random(4)
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    idle = {"util_gpu_pct": 0, "sm_clock_mhz": 345, "power_w": 90.0, "temp_gpu_c": 34.0}
    for _ in range(3):
        flags = d.update(node(rng, **idle), {})
    assert flags[5][0] is None


def test_temperature_is_compared_at_power() -> None:
    # Hotter because it draws more: nothing odd once the node's own slope takes power out.
    points = {g: (500.0 + 40 * g, 40.0 + 0.05 * 40 * g) for g in range(8)}
    residuals = temp_at_power(points)
    assert max(residuals.values()) - min(residuals.values()) < 1e-6
