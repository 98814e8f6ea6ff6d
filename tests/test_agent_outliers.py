"""Peer outliers, unit by unit: a 1-in-8 outlier is flagged on its second poll, not its first,
on every metric; eight GPUs that merely differ a little are not; idle GPUs are not compared on
clocks or power. (The fleet-day false-flag rate is benchmarks/agent_outliers.py.)"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from sentinel.agent.health.outliers import PeerOutliers, temp_at_power
from sentinel.agent.nvml.readings import GpuReading
from sentinel.config import HealthThresholds

T = HealthThresholds()


def node(rng: random.Random, **odd: float) -> list[GpuReading]:
    """Eight busy GPUs with a little spread; `odd` changes GPU 5 (field=new value)."""
    out = []
    for g in range(8):
        power = 620 + rng.gauss(0, 15)
        r = GpuReading(
            index=g,
            util_gpu_pct=97,
            power_w=power,
            temp_gpu_c=30 + 0.045 * power + rng.gauss(0, 0.8),
            sm_clock_mhz=1980 - 15 * rng.randint(0, 2),
        )
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
    residuals = temp_at_power(points, 0.05)
    assert max(residuals.values()) - min(residuals.values()) < 1e-6


def slot_node(
    rng: random.Random, watts: float, resistance: dict[int, float], heat: float | None = None
) -> list[GpuReading]:
    """Eight GPUs at `watts` each (util follows load), temperature = 28 C + resistance x the
    power the heat sink has caught up with (`heat`, default `watts`): `resistance` (C per W)
    per GPU, 0.045 for the ones not named; sensor noise 0.3 C."""
    return [
        GpuReading(
            index=g,
            util_gpu_pct=97 if watts > 300 else 3,
            power_w=watts,
            temp_gpu_c=28 + resistance.get(g, 0.045) * (heat or watts) + rng.gauss(0, 0.3),
            sm_clock_mhz=1980,
        )
        for g in range(8)
    ]


def shifted(readings: list[GpuReading], gpu: int, field: str, by: float) -> list[GpuReading]:
    """The readings with one GPU's `field` moved by `by`."""
    return [
        replace(r, **{field: getattr(r, field) + by}) if r.index == gpu else r for r in readings
    ]


def flagged(d: PeerOutliers, readings: list[GpuReading]) -> set[int]:
    return {g for g, (why, _) in d.update(readings, {}).items() if why is not None}


def settled(sweep: Callable[[], list[GpuReading]]) -> PeerOutliers:
    """A detector that has seen a minute of `sweep`: past learning each GPU's place."""
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    for _ in range(60):
        flagged(d, sweep())
    return d


def test_a_slot_that_always_runs_warm_is_its_place_not_a_fault() -> None:
    # GPU 5 sits where the airflow is poorest: 9 C warmer than its peers at 620 W, every sweep,
    # through idle spells (the heat sink follows power over ~20 s). That is where it sits;
    # 10 C more on top of it is a fault.
    rng = random.Random(5)
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    warm, heat = {5: 0.045 + 9 / 620}, 620.0
    for poll in range(3600):
        watts = 120.0 if poll % 900 > 840 else 620.0  # a minute of idle every 15
        heat += (watts - heat) / 20
        assert not flagged(d, slot_node(rng, watts, warm, heat)), poll
    hot = shifted(slot_node(rng, 620.0, warm), 5, "temp_gpu_c", 10)
    assert not flagged(d, hot)
    assert flagged(d, hot) == {5}


def test_a_gpu_far_off_its_peers_from_the_start_is_flagged() -> None:
    # Learning each GPU's place cannot learn a fault present at start: 18 C is past any slot's.
    rng = random.Random(6)
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    hot = {2: 0.045 + 18 / 620}
    assert not flagged(d, slot_node(rng, 620.0, hot))
    assert flagged(d, slot_node(rng, 620.0, hot)) == {2}


def test_a_fault_is_not_learned_into_the_gpus_place() -> None:
    rng = random.Random(7)
    d = settled(lambda: slot_node(rng, 620.0, {}))
    for poll in range(2 * 3600):  # two hours 9 C hotter: still odd at the end
        found = flagged(d, slot_node(rng, 620.0, {3: 0.045 + 9 / 620}))
        assert found == ({3} if poll >= 1 else set()), poll


def test_a_few_degrees_is_never_an_outlier_however_tight_the_peers() -> None:
    # Seven GPUs that agree to a tenth of a degree: the eighth 3 C warmer, arriving after the
    # places are learned, is still not an outlier (the least effect for temperature is 4 C).
    rng = random.Random(8)
    d = settled(lambda: slot_node(rng, 620.0, {}))
    for _ in range(600):
        assert not flagged(d, shifted(slot_node(rng, 620.0, {}), 6, "temp_gpu_c", 3))


@pytest.mark.parametrize(
    ("watts", "off", "odd"),
    [(620.0, -80.0, False), (620.0, 90.0, False), (620.0, -155.0, True), (320.0, -60.0, True)],
)
def test_powers_least_effect_grows_with_the_draw(watts: float, off: float, odd: bool) -> None:
    # Peers that agree to the watt: at 620 W a GPU 80 or 90 W off them is within a busy GPU's
    # one-second swing (power's least effect is 15% of the peers' draw, 93 W here), 155 W (a
    # quarter) is a fault; at 320 W the fixed 50 W is the least effect.
    rng = random.Random(9)
    d = settled(lambda: slot_node(rng, watts, {}))
    for _ in range(2):
        found = flagged(d, shifted(slot_node(rng, watts, {}), 4, "power_w", off))
    assert found == ({4} if odd else set())


def test_places_learned_while_the_node_warms_up_do_not_flag_it_later() -> None:
    # The agent starts with the node idle; a job starts five minutes later and the heat sinks
    # take ~20 s to catch up with the power, so the first busy sweeps understate GPU 1's warm
    # slot (8 C at 620 W) and GPU 4's cool one (-5 C). Neither is ever an outlier; a fault
    # after an hour still is.
    rng = random.Random(9)
    d = PeerOutliers(T.outlier_z, T.outlier_polls)
    slots, heat = {1: 0.045 + 8 / 620, 4: 0.045 - 5 / 620}, 100.0
    for poll in range(3900):
        watts = 100.0 if poll < 300 else 620.0
        heat += (watts - heat) / 20
        assert not flagged(d, slot_node(rng, watts, slots, heat)), poll
    hot = slots | {6: 0.045 + 10 / 620}
    assert not flagged(d, slot_node(rng, 620.0, hot))
    assert flagged(d, slot_node(rng, 620.0, hot)) == {6}


def test_odd_one_way_then_the_other_is_noise_not_an_outlier() -> None:
    # Power is judged either way, so a GPU 120 W over its peers one sweep and 120 W under the
    # next has been past the limit twice, never the same way twice: not a finding.
    rng = random.Random(10)
    d = settled(lambda: node(rng))
    for sweep in range(20):
        swing = 120.0 if sweep % 2 else -120.0
        assert not flagged(d, shifted(node(rng), 3, "power_w", swing)), sweep
    low = [replace(r, power_w=400.0) if r.index == 3 else r for r in node(rng)]
    assert not flagged(d, low)
    assert flagged(d, low) == {3}


def test_one_median_and_mad_serve_the_agent_and_burn_in() -> None:
    """The agent pools the MAD itself (scale 1) and scales later; burn-in's judges take it as a
    normal sample's standard deviation (MAD_SCALE). Neither has a median of nothing."""
    from sentinel.stats import MAD_SCALE, mad, median

    assert median([3.0, 1.0, 2.0]) == 2.0 and median(iter([4.0, 1.0, 3.0, 2.0])) == 2.5
    assert mad([1.0, 2.0, 3.0, 4.0, 100.0], scale=1.0) == 1.0
    assert mad([1.0, 2.0, 3.0, 4.0, 100.0], scale=MAD_SCALE) == MAD_SCALE
    with pytest.raises(ValueError, match="median of nothing"):
        median([])
