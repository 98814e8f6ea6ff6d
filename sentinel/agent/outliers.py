"""Peer-relative outliers: the GPU that is only odd compared with the other GPUs of its node.

A fixed limit misses a GPU that runs 12 C hotter than its seven peers at the same power, or
holds clocks 15% lower under the same job: each reading is normal on its own. Per sweep, each
metric is scored with a robust z-score against the node's GPUs (median and MAD, so the odd one
cannot drag the reference), at like load:

- temperature at power: the temperature left after the node's own temperature-per-watt slope
  (Theil-Sen over the GPU pairs, so one GPU cannot bend it) takes out the power difference;
  power is smoothed per GPU first (`POWER_EMA`), because a heat sink follows power over tens
  of seconds, not sample by sample;
- SM clock and power draw, among the GPUs busy at >= `busy_util_pct` only;
- error rates (corrected ECC, PCIe replay, NVLink), per minute.

Each metric has a floor under its spread (`FLOORS`): eight GPUs that agree to the degree are
not an invitation to flag the one 1.5 C off. And each is judged in the direction that means
trouble (`SIDES`): hotter at the same power, slower clocks, more errors, power off either way;
a GPU that runs cooler or faster than its peers is not a finding. A GPU is flagged after `polls` sweeps in a row at
|z| >= `z_limit` (2: one noisy sample is not a finding) and is quiet again once every score is
under half the limit. Pure Python: eight numbers per metric cost less than numpy's call overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from sentinel.agent.readings import GpuReading

# The least spread a metric is judged against, in its unit (C, MHz, W, errors per minute).
FLOORS = {"temperature at power": 2.0, "SM clock": 30.0, "power": 30.0, "error rate": 20.0}
# +1: only above the peers is odd; -1: only below; 0: either way.
SIDES = {"temperature at power": 1, "SM clock": -1, "power": 0, "error rate": 1}
MAD_TO_SIGMA = 1.4826
MIN_PEERS = 4  # fewer GPUs than this in a comparison: no reference to be odd against
SLOPE_RANGE = (0.0, 0.15)  # C per W: what a GPU's cooling can plausibly be
POWER_EMA = 0.1  # weight of the newest power sample in the smoothed power (~10 polls)

# (how odd, in the metric's bad direction; signed z; metric; value; peers' median)
Score = tuple[float, float, str, float, float]


def _scores(metric: str, values: dict[int, float], worst: dict[int, Score]) -> None:
    """Score every GPU on one metric, keeping each GPU's oddest score in `worst`."""
    if len(values) < MIN_PEERS:
        return
    mid = median(values.values())
    scale = max(MAD_TO_SIGMA * median([abs(x - mid) for x in values.values()]), FLOORS[metric])
    side = SIDES[metric]
    for gpu, x in values.items():
        z = (x - mid) / scale
        odd = abs(z) if side == 0 else max(0.0, side * z)
        if gpu not in worst or odd > worst[gpu][0]:
            worst[gpu] = (odd, z, metric, x, mid)


def _slope(points: Sequence[tuple[float, float]]) -> float:
    """Theil-Sen: the median slope over pairs at least 20 W apart; 0 when none are."""
    slopes = [
        (t2 - t1) / (p2 - p1)
        for i, (p1, t1) in enumerate(points)
        for p2, t2 in points[i + 1 :]
        if abs(p2 - p1) >= 20.0
    ]
    low, high = SLOPE_RANGE
    return min(high, max(low, median(slopes))) if slopes else 0.0


def temp_at_power(points: dict[int, tuple[float, float]]) -> dict[int, float]:
    """GPU -> temperature with the node's temperature-per-watt taken out, from (power, temp)."""
    if len(points) < MIN_PEERS:
        return {}
    slope = _slope(list(points.values()))
    mid_power = median(p for p, _ in points.values())
    return {g: t - slope * (p - mid_power) for g, (p, t) in points.items()}


class PeerOutliers:
    """Flags a GPU after `polls` sweeps in a row with a score at or past `z_limit`."""

    def __init__(self, z_limit: float, polls: int = 2, busy_util_pct: float = 50.0) -> None:
        self.z_limit = z_limit
        self.polls = polls
        self.busy_util_pct = busy_util_pct
        self._streak: dict[int, int] = {}
        self._power: dict[int, float] = {}  # smoothed power per GPU

    def _smoothed(self, gpu: int, watts: float) -> float:
        last = self._power.get(gpu)
        value = watts if last is None else last + POWER_EMA * (watts - last)
        self._power[gpu] = value
        return value

    def scores(self, readings: Sequence[GpuReading], rates: dict[int, float]) -> dict[int, Score]:
        """Each GPU's worst score over every metric it can be compared on, this sweep."""
        worst: dict[int, Score] = {}
        heat: dict[int, tuple[float, float]] = {}
        clocks: dict[int, float] = {}
        power: dict[int, float] = {}
        busy = self.busy_util_pct
        for r in readings:
            if r.lost:
                self._power.pop(r.index, None)
                continue
            if r.power_w is not None:
                smooth = self._smoothed(r.index, r.power_w)
                if r.temp_gpu_c is not None:
                    heat[r.index] = (smooth, r.temp_gpu_c)
            if r.util_gpu_pct is not None and r.util_gpu_pct >= busy:
                if r.sm_clock_mhz is not None:
                    clocks[r.index] = float(r.sm_clock_mhz)
                if r.power_w is not None:
                    power[r.index] = r.power_w
        _scores("temperature at power", temp_at_power(heat), worst)
        _scores("SM clock", clocks, worst)
        _scores("power", power, worst)
        _scores("error rate", rates, worst)
        return worst

    def update(
        self, readings: Sequence[GpuReading], rates: dict[int, float]
    ) -> dict[int, tuple[str | None, bool]]:
        """Per GPU: (why it is an outlier now or None, whether all its scores are quiet)."""
        worst = self.scores(readings, rates)
        limit, out = self.z_limit, {}
        for r in readings:
            score = worst.get(r.index)
            odd = score[0] if score is not None else 0.0
            streak = self._streak[r.index] = self._streak.get(r.index, 0) + 1 if odd >= limit else 0
            why = None
            if score is not None and streak >= self.polls:
                _, z, metric, value, mid = score
                why = f"{metric} {value:.1f} vs peers' {mid:.1f} (robust z {z:+.1f})"
            out[r.index] = (why, odd < limit / 2)
        return out
