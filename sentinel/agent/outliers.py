"""Peer-relative outliers: the GPU that is only odd compared with the other GPUs of its node.

A fixed limit misses a GPU that runs 12 C hotter than its seven peers at the same power, or
holds clocks 15% lower under the same job: each reading is normal on its own. Per sweep, each
metric is scored with a robust z-score against the node's GPUs (median and MAD, so the odd one
cannot drag the reference), at like load:

- temperature at power: the temperature left after the node's own temperature-per-watt slope
  (Theil-Sen over the GPU pairs, so one GPU cannot bend it) takes out the power difference;
- SM clock and power draw, among the GPUs busy at >= `busy_util_pct` only;
- error rates (corrected ECC, PCIe replay, NVLink), per minute.

Each metric has a floor under its spread (`FLOORS`): eight GPUs that agree to the degree are
not an invitation to flag the one 1.5 C off. A GPU is flagged after `polls` sweeps in a row at
|z| >= `z_limit` (2: one noisy sample is not a finding) and is quiet again once every score is
under half the limit. Pure Python: eight numbers per metric cost less than numpy's call overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from sentinel.agent.readings import GpuReading

# The least spread a metric is judged against, in its unit (C, MHz, W, errors per minute).
FLOORS = {"temp_at_power": 2.0, "sm_clock": 30.0, "power": 30.0, "error_rate": 20.0}
MAD_TO_SIGMA = 1.4826
MIN_PEERS = 4  # fewer GPUs than this in a comparison: no reference to be odd against
SLOPE_RANGE = (0.0, 0.15)  # C per W: what a GPU's cooling can plausibly be


@dataclass(frozen=True, slots=True)
class PeerScore:
    gpu: int
    metric: str
    value: float
    reference: float
    z: float

    def describe(self) -> str:
        return (
            f"{self.metric.replace('_', ' ')} {self.value:.1f} vs peers' {self.reference:.1f} "
            f"(robust z {self.z:+.1f})"
        )


def robust_scores(metric: str, values: dict[int, float]) -> list[PeerScore]:
    if len(values) < MIN_PEERS:
        return []
    mid = median(values.values())
    mad = median(abs(x - mid) for x in values.values())
    scale = max(MAD_TO_SIGMA * mad, FLOORS[metric])
    return [PeerScore(g, metric, x, mid, (x - mid) / scale) for g, x in values.items()]


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


def _temp_at_power(readings: Sequence[GpuReading]) -> dict[int, float]:
    pts = {
        r.index: (r.power_w, r.temp_gpu_c)
        for r in readings
        if r.power_w is not None and r.temp_gpu_c is not None
    }
    if len(pts) < MIN_PEERS:
        return {}
    slope = _slope(list(pts.values()))
    mid_power = median(p for p, _ in pts.values())
    return {g: t - slope * (p - mid_power) for g, (p, t) in pts.items()}


def peer_scores(
    readings: Sequence[GpuReading], rates: dict[int, float], busy_util_pct: float
) -> list[PeerScore]:
    """Every GPU's score on every metric it can be compared on, this sweep."""
    live = [r for r in readings if not r.lost]
    busy = [r for r in live if r.util_gpu_pct is not None and r.util_gpu_pct >= busy_util_pct]
    clocks = {r.index: float(r.sm_clock_mhz) for r in busy if r.sm_clock_mhz is not None}
    power = {r.index: r.power_w for r in busy if r.power_w is not None}
    return [
        *robust_scores("temp_at_power", _temp_at_power(live)),
        *robust_scores("sm_clock", clocks),
        *robust_scores("power", power),
        *robust_scores("error_rate", rates),
    ]


class PeerOutliers:
    """Flags a GPU after `polls` sweeps in a row with a score at or past `z_limit`."""

    def __init__(self, z_limit: float, polls: int = 2, busy_util_pct: float = 50.0) -> None:
        self.z_limit = z_limit
        self.polls = polls
        self.busy_util_pct = busy_util_pct
        self._streak: dict[int, int] = {}

    def update(
        self, readings: Sequence[GpuReading], rates: dict[int, float]
    ) -> dict[int, tuple[str | None, bool]]:
        """Per GPU: (why it is an outlier now or None, whether all its scores are quiet)."""
        worst: dict[int, PeerScore] = {}
        for s in peer_scores(readings, rates, self.busy_util_pct):
            if s.gpu not in worst or abs(s.z) > abs(worst[s.gpu].z):
                worst[s.gpu] = s
        out: dict[int, tuple[str | None, bool]] = {}
        for r in readings:
            score = worst.get(r.index)
            odd = score is not None and abs(score.z) >= self.z_limit
            streak = self._streak[r.index] = self._streak.get(r.index, 0) + 1 if odd else 0
            why = score.describe() if odd and score and streak >= self.polls else None
            out[r.index] = (why, score is None or abs(score.z) < self.z_limit / 2)
        return out
