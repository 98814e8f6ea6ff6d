"""Straggler scoring: each rank's compute time against the gang's median, window by window.

Every `window` steps each rank contributes one number, the lower quartile of its per-step compute
time over the window, to one small `all_gather` on a side gloo group
(`hooks.Exchange`). Every rank then sees the whole gang's vector and judges *itself*: its
slowdown is its own value divided by the median of its peers, the other ranks doing the same
work (its data-parallel replicas: same pipeline stage, same tensor shard), or of the rest of the
gang when no peer groups are known. Comparing across pipeline stages would blame a stage for
doing more work than another (the first stage's compute runs ~20% above the last's in the
reference trainer), and a rank is left out of its own median so that a slow rank of a pair
still stands out. Only the worst offenders count (a slowdown within `worst_share` of the gang's
largest, measured above 1): the ranks a straggler holds up in the pipeline wait for it inside
their own step, so they look slow too, but always less slow than the rank that makes them wait. A rank that stays at or above
`threshold` (e.g. 1.03) for `persist` consecutive windows is flagged once, and cleared when it
has stayed back under it for `persist` windows. With window=20 and persist=3 a persistent 5%
straggler is flagged within 60 steps of the slowdown starting (80 if it starts mid-window).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StragglerFinding:
    rank: int
    slowdown: float
    compute_s: float
    median_compute_s: float


class StragglerScorer:
    def __init__(
        self, threshold: float = 1.03, persist: int = 3, worst_share: float = 0.75
    ) -> None:
        self.threshold = threshold
        self.persist = persist
        self.worst_share = worst_share
        self._streak: dict[int, int] = {}
        self.flagged: set[int] = set()

    def update(
        self, per_rank_compute_s: Sequence[float], peers: Sequence[Sequence[int]] | None = None
    ) -> list[StragglerFinding]:
        """Score one window (a value per rank, NaN/<=0 where a rank had no data); `peers`
        are groups of ranks doing the same work.

        Returns newly flagged ranks only; `flagged` holds all currently flagged ones.
        """
        values = list(per_rank_compute_s)
        if sum(v > 0 for v in values) < 2:
            return []
        group_of = {r: g for g in peers or [] for r in g}
        scored = []
        for rank, value in enumerate(values):
            others = [values[r] for r in group_of.get(rank, []) if r != rank and values[r] > 0]
            if not others:
                others = [v for r, v in enumerate(values) if r != rank and v > 0]
            median = statistics.median(others) if others else 0.0
            scored.append((value / median if value > 0 and median > 0 else 0.0, median))
        worst = max(sd for sd, _ in scored)
        new = []
        for rank, (slowdown, median) in enumerate(scored):
            value = values[rank]
            culprit = slowdown - 1.0 >= self.worst_share * (worst - 1.0)
            if slowdown >= self.threshold and culprit:
                self._streak[rank] = max(0, self._streak.get(rank, 0)) + 1
            else:  # a negative streak counts windows back under the threshold
                self._streak[rank] = min(0, self._streak.get(rank, 0)) - 1
                if self._streak[rank] <= -self.persist:
                    self.flagged.discard(rank)
            if self._streak[rank] >= self.persist and rank not in self.flagged:
                self.flagged.add(rank)
                new.append(StragglerFinding(rank, slowdown, value, median))
        return new


class WindowStats:
    """A rank's compute times within the current window, summarised by their lower quartile.

    Interference (a noisy neighbour, a page fault, the OS) only ever adds time to a step, so the
    lower quartile tracks what the rank's hardware needs for the work while ignoring the
    preempted steps that would make a median or a mean wander between windows.
    """

    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, compute_s: float) -> None:
        self.values.append(compute_s)

    def take_median(self) -> float:
        value = _lower_quartile(self.values) if self.values else 0.0
        self.values = []
        return value


def _lower_quartile(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]
