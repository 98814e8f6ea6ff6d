"""Loss and grad-norm anomalies: NaN/Inf at once, spikes against robust running statistics.

Four spike policies share one interface (`update(value) -> threshold | None`), so they can be
compared on the same curves (`benchmarks/anomaly.py`):

- `robust` (default): a robust level + k x MAD, and at least `min_ratio` x the level. Median
  and MAD ignore the spikes themselves and the heavy-tailed noise of grad norms, which is what
  makes a mean/sigma rule either blind or noisy. For the loss the level is the median of the
  last 8 values and the MAD that of step-to-step changes over the last 32, so the threshold
  follows a loss that is still falling fast (a window's plain MAD spreads over the whole descent
  and lifts the threshold above even a batch of random tokens); its warm-up is short (8 values)
  because a restarted rank starts with no history. Grad norms keep the plain median/MAD over a
  long window (128 values, 16 to warm up): their noise is heavy-tailed and their level moves
  slowly.
- `megatron`: value >= 10 x the running maximum (Megatron-LM's loss check).
- `olmo`: value > mean + 6 sigma over the last 128 values (OLMo-core's spike skipping).
- `zclip`: EMA z-score > 2.5 (ZClip's adaptive clipping trigger).

Flagged values are not folded into the statistics, so one spike does not hide the next.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Anomaly:
    step: int
    metric: str  # "loss" or "grad_norm"
    anomaly: str  # "nan", "inf" or "spike"
    value: float
    baseline: float | None
    threshold: float | None


class SpikePolicy(Protocol):
    def update(self, value: float) -> float | None:
        """Fold in `value`; return the threshold it exceeded, or None if it is normal."""
        ...


class RobustSpike:
    """Median + k x MAD; the statistics are refreshed every `refresh` values (they move slowly).

    With `trend` (the loss), the level is the median of the last `level_n` values and the spread
    is the MAD of step-to-step changes (divided by sqrt 2: the noise of one value), so a loss
    still falling fast is judged against where it is now and how much it jitters, not against
    the whole descent the window spans. Without it (grad norms), both come from the window.
    """

    def __init__(
        self,
        window: int = 32,
        k: float = 8.0,
        min_ratio: float = 1.3,
        warmup: int = 8,
        refresh: int = 4,
        trend: bool = True,
        level_n: int = 8,
    ) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.k, self.min_ratio, self.warmup, self.refresh = k, min_ratio, warmup, refresh
        self.trend, self.level_n = trend, level_n
        self.baseline: float | None = None
        self._threshold = math.inf
        self._since = refresh

    def _recompute(self) -> None:
        values = list(self.values)
        if self.trend:
            med = statistics.median(values[-self.level_n :])
            steps = [abs(b - a) for a, b in itertools.pairwise(values)]
            spread = statistics.median(steps) / math.sqrt(2)
        else:
            med = statistics.median(values)
            spread = statistics.median([abs(v - med) for v in values])
        self.baseline = med
        self._threshold = max(med + self.k * 1.4826 * spread, med * self.min_ratio)
        self._since = 0

    def update(self, value: float) -> float | None:
        if len(self.values) >= self.warmup:
            if self._since >= self.refresh:
                self._recompute()
            if value > self._threshold:
                return self._threshold
        self.values.append(value)
        self._since += 1
        return None


class RunningMaxSpike:
    def __init__(self, factor: float = 10.0, warmup: int = 1) -> None:
        self.factor, self.warmup, self.n = factor, warmup, 0
        self.max = -math.inf
        self.baseline: float | None = None

    def update(self, value: float) -> float | None:
        if self.n >= self.warmup and value >= self.factor * self.max:
            return self.factor * self.max
        self.max = max(self.max, value)
        self.baseline = self.max
        self.n += 1
        return None


class WindowSigmaSpike:
    def __init__(self, window: int = 128, sigmas: float = 6.0, warmup: int = 16) -> None:
        self.values: deque[float] = deque()
        self.window, self.sigmas, self.warmup = window, sigmas, warmup
        self.baseline: float | None = None
        self._sum = 0.0
        self._sumsq = 0.0

    def update(self, value: float) -> float | None:
        n = len(self.values)
        if n >= self.warmup:
            mean = self._sum / n
            threshold = mean + self.sigmas * math.sqrt(max(0.0, self._sumsq / n - mean * mean))
            self.baseline = mean
            if value > threshold:
                return threshold
        self.values.append(value)
        self._sum += value
        self._sumsq += value * value
        if len(self.values) > self.window:
            old = self.values.popleft()
            self._sum -= old
            self._sumsq -= old * old
        return None


class EmaZSpike:
    def __init__(self, alpha: float = 0.97, z: float = 2.5, warmup: int = 16) -> None:
        self.alpha, self.z, self.warmup, self.n = alpha, z, warmup, 0
        self.mean = 0.0
        self.var = 0.0
        self.baseline: float | None = None

    def update(self, value: float) -> float | None:
        if self.n >= self.warmup:
            threshold = self.mean + self.z * math.sqrt(self.var)
            self.baseline = self.mean
            if value > threshold:
                return threshold
        if self.n == 0:
            self.mean = value
        else:
            delta = value - self.mean
            self.mean += (1 - self.alpha) * delta
            self.var = self.alpha * (self.var + (1 - self.alpha) * delta * delta)
        self.n += 1
        return None


POLICIES: dict[str, type] = {
    "robust": RobustSpike,
    "megatron": RunningMaxSpike,
    "olmo": WindowSigmaSpike,
    "zclip": EmaZSpike,
}


# Per-metric settings of a policy where one size does not fit both curves.
METRIC_SETTINGS: dict[tuple[str, str], dict[str, int]] = {
    ("robust", "grad_norm"): {"window": 128, "warmup": 16, "refresh": 16, "trend": False},
}


def make_policy(name: str, metric: str = "loss") -> SpikePolicy:
    try:
        return POLICIES[name](**METRIC_SETTINGS.get((name, metric), {}))
    except KeyError:
        raise ValueError(
            f"unknown spike policy {name!r}; choose one of {sorted(POLICIES)}"
        ) from None


class AnomalyMonitor:
    """Checks each step's loss and grad norm; returns what is anomalous."""

    def __init__(self, policy: str = "robust") -> None:
        self._detectors = {m: make_policy(policy, m) for m in ("loss", "grad_norm")}

    def update(self, step: int, metric: str, value: float | None) -> Anomaly | None:
        if value is None:
            return None
        if math.isnan(value) or math.isinf(value):
            kind = "nan" if math.isnan(value) else "inf"
            return Anomaly(step, metric, kind, value, None, None)
        detector = self._detectors[metric]
        threshold = detector.update(value)
        if threshold is None:
            return None
        baseline = getattr(detector, "baseline", None)
        return Anomaly(step, metric, "spike", value, baseline, threshold)
