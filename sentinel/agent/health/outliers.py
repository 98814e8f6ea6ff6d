"""Peer-relative outliers: the GPU that is only odd compared with the other GPUs of its node.

A fixed limit misses a GPU that runs 12 C hotter than its seven peers at the same power, or
holds clocks 15% lower under the same job: each reading is normal on its own. Per sweep, each
signal is compared across the node's GPUs at like load (`peer_stats.PeerSignal`: a robust
z-score against the node's pooled spread, after each GPU's learned place among its peers):

- temperature at power: the temperature left after the node's own temperature-per-watt slope
  (Theil-Sen over the GPU pairs, so one GPU cannot bend it, then smoothed over ~100 sweeps, as
  a node's cooling does not change by the second) takes out the power difference; power is
  smoothed per GPU first (`POWER_EMA`), because a heat sink follows power over tens of
  seconds, not sample by sample. A GPU's place here is a thermal resistance (C per W), as a
  board position's airflow is: a slot 6 C warmer at 600 W is about 1 C warmer at idle;
- SM clock and power draw, among the GPUs busy at >= `busy_util_pct` only;
- error rates (corrected ECC, PCIe replay, NVLink), per minute: every GPU should read alike.

Each signal is judged in the direction that means trouble (`SIGNALS`): hotter at the same
power, slower clocks, more errors, power off either way; a GPU cooler or faster than its peers
is not a finding. A GPU is flagged after `polls` sweeps in a row at or past `z_limit` on one
signal, the same way (2: one noisy sample is not a finding), and is quiet again once every
score is under half the limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from sentinel.agent.health.peer_stats import MIN_PEERS, PeerSignal, Score, Signal
from sentinel.agent.nvml.readings import GpuReading
from sentinel.stats import median

TEMP, CLOCK, POWER, ERRORS = "temperature at power", "SM clock", "power", "error rate"
# The least effects are physical: a few degrees is sensor and airflow, four clock bins are
# within a busy GPU's step-to-step swing, and so is a power reading 15% off its peers' (one
# second of a step's compute and communication phases, and a swing that grows with the draw:
# a fixed 50 W was 4 sd of that swing at 620 W, ~1 false finding per 1,000 GPU-days, while the
# power faults worth a person's look, a brake or a derated board, take a quarter or more). The
# place limits are how far a board position (temperature) or a chip's silicon (clocks, power
# at the cap) plausibly sets a GPU apart from its peers.
SIGNALS = {
    TEMP: Signal(TEMP, side=1, floor=0.5, min_effect=4.0, place_limit=6.0),
    CLOCK: Signal(CLOCK, side=-1, floor=15.0, min_effect=60.0, place_limit=60.0),
    POWER: Signal(POWER, side=0, floor=10.0, min_effect=50.0, place_limit=50.0, min_share=0.15),
    ERRORS: Signal(ERRORS, side=1, floor=20.0, min_effect=20.0, place_limit=0.0),
}
SLOPE_RANGE = (0.0, 0.15)  # C per W: what a GPU's cooling can plausibly be
SLOPE_POLLS = 100  # the node's slope, smoothed over ~100 sweeps
POWER_EMA = 0.1  # weight of the newest power sample in the smoothed power (~10 polls)


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Theil-Sen: the median slope over pairs at least 20 W apart; None when none are."""
    slopes = [
        (t2 - t1) / (p2 - p1)
        for i, (p1, t1) in enumerate(points)
        for p2, t2 in points[i + 1 :]
        if abs(p2 - p1) >= 20.0
    ]
    low, high = SLOPE_RANGE
    return min(high, max(low, median(slopes))) if slopes else None


def temp_at_power(points: dict[int, tuple[float, float]], slope: float) -> dict[int, float]:
    """GPU -> temperature with `slope` (C per W) times its power off the median taken out."""
    mid_power = median(p for p, _ in points.values())
    return {g: t - slope * (p - mid_power) for g, (p, t) in points.items()}


class PeerOutliers:
    """Flags a GPU after `polls` sweeps in a row past `z_limit` on one signal, the same way."""

    def __init__(self, z_limit: float, polls: int = 2, busy_util_pct: float = 50.0) -> None:
        self.z_limit = z_limit
        self.polls = polls
        self.busy_util_pct = busy_util_pct
        self._power: dict[int, float] = {}  # smoothed power per GPU
        self._slope: float | None = None  # the node's smoothed temperature-per-watt
        self._signals = {name: PeerSignal(s) for name, s in SIGNALS.items()}

    def _smoothed(self, gpu: int, watts: float) -> float:
        last = self._power.get(gpu)
        value = watts if last is None else last + POWER_EMA * (watts - last)
        self._power[gpu] = value
        return value

    def _heat(self, points: dict[int, tuple[float, float]]) -> dict[int, float]:
        if len(points) < MIN_PEERS:
            return {}
        now = _slope(list(points.values()))
        if now is not None:
            last = now if self._slope is None else self._slope
            self._slope = last + (now - last) / SLOPE_POLLS
        return temp_at_power(points, self._slope or 0.0)

    def scores(self, readings: Sequence[GpuReading], rates: dict[int, float]) -> dict[int, Score]:
        """Each GPU's worst score over every signal it can be compared on, this sweep."""
        worst: dict[int, Score] = {}
        heat: dict[int, tuple[float, float]] = {}
        clocks: dict[int, float] = {}
        power: dict[int, float] = {}
        busy: set[int] = set()
        for r in readings:
            if r.lost:
                self._power.pop(r.index, None)
                continue
            if r.power_w is not None:
                smooth = self._smoothed(r.index, r.power_w)
                if r.temp_gpu_c is not None:
                    heat[r.index] = (smooth, r.temp_gpu_c)
            if r.util_gpu_pct is not None and r.util_gpu_pct >= self.busy_util_pct:
                busy.add(r.index)
                if r.sm_clock_mhz is not None:
                    clocks[r.index] = float(r.sm_clock_mhz)
                if r.power_w is not None:
                    power[r.index] = r.power_w
        z, s = self.z_limit, self._signals
        # A slot's place in temperature is learned at load only, where it shows above noise.
        loads = {g: p for g, (p, _) in heat.items()}
        s[TEMP].score(self._heat(heat), z, worst, loads, learn=busy)
        s[CLOCK].score(clocks, z, worst)
        s[POWER].score(power, z, worst)
        if any(rates.values()):  # no errors anywhere (nearly every sweep): nothing to compare
            s[ERRORS].score(rates, z, worst)
        return worst

    def update(
        self, readings: Sequence[GpuReading], rates: dict[int, float]
    ) -> dict[int, tuple[str | None, bool]]:
        """Per GPU: (why it is an outlier now or None, whether all its scores are quiet). An
        outlier is one signal past the limit the same way `polls` sweeps in a row: a GPU high
        one sweep and low the next, or odd on one signal then on another, is noise."""
        worst = self.scores(readings, rates)
        out: dict[int, tuple[str | None, bool]] = {}
        for r in readings:
            score = worst.get(r.index)
            if score is None:
                out[r.index] = (None, True)
                continue
            run, odd, z, signal, value, mid = score
            why = None
            if run >= self.polls:
                why = f"{signal} {value:.1f} vs peers' {mid:.1f} (robust z {z:+.1f})"
            out[r.index] = (why, odd < self.z_limit / 2)
        return out
