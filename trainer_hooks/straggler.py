"""Straggler scoring: each rank's own compute, step by step, against its peers' at the same step.

What is compared. Every rank times its own compute in every step (`trainer_hooks.timing`: on a
CPU device its CPU time, on a GPU the step less its waits on other ranks), so the ranks a
straggler holds up, which wait for it in pipeline receives, tensor-parallel and data-parallel
collectives, do not look slow themselves. At each gang exchange every rank contributes the
per-step values it measured since the last one (`StepLog`), and every rank scores the whole
gang from the same rows, judging *itself*.

Against whom. A rank's peers are the other ranks doing the same work: in the reference trainer
the ranks of its pipeline stage (its tensor-parallel shards do equal work, its data-parallel
replicas the same), or the rest of the gang when no groups are given. Comparing across stages
would blame the first stage for its embedding (it runs ~20% above the last).

How. For every step, a rank's ratio is its value over the median of its peers' values at that
step: load that comes and goes on the machine raises a whole step on every rank and cancels.
Steps are grouped into windows of `window` steps; a window's slowdown is the median of its
ratios, so a burst of interference shorter than half a window (a neighbour's job, the rank's
own garbage collection) does not move it. A rank whose slowdown is at or above `threshold` for
`persist` consecutive windows is flagged once, and cleared once it has stayed under it for
`persist` windows. The ranks a straggler holds up need no special care: their waits are not
in their compute.
With the defaults (window 20, threshold 1.03, persist 4) a persistent 5% straggler is flagged
within 80-100 steps of its slowdown starting, and a rank needs four windows in a row, each
with most of its steps 3% slower than its peers, to be flagged at all.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StragglerFinding:
    rank: int
    slowdown: float
    compute_s: float  # the rank's median compute per step over the window
    median_compute_s: float  # its peers' over the same steps


class StepLog:
    """A rank's (step, compute seconds) since the last exchange, as one fixed-length row."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: list[tuple[int, float]] = []

    def add(self, step: int, compute_s: float) -> None:
        self.entries.append((step, compute_s))

    def take(self) -> list[float]:
        """`size` steps then `size` values, the newest `size` entries, padded with -1 / NaN."""
        kept, self.entries = self.entries[-self.size :], []
        pad = self.size - len(kept)
        return [float(s) for s, _ in kept] + [-1.0] * pad + [v for _, v in kept] + [math.nan] * pad


def decode_row(row: Sequence[float]) -> dict[int, float]:
    """A `StepLog.take()` row back into {step: compute seconds} (padding and bad values out)."""
    n = len(row) // 2
    return {int(s): v for s, v in zip(row[:n], row[n:], strict=True) if s >= 0 and v > 0}


class StragglerScorer:
    def __init__(
        self,
        threshold: float = 1.03,
        persist: int = 4,
        window: int = 20,
    ) -> None:
        self.threshold, self.persist, self.window = threshold, persist, window
        self._steps: dict[int, dict[int, float]] = {}  # step -> {rank: compute seconds}
        self._scored = -1  # the last window judged (windows are step // window)
        self._streak: dict[int, int] = {}
        self.flagged: set[int] = set()

    def update(
        self, rows: Sequence[dict[int, float]], peers: Sequence[Sequence[int]] | None = None
    ) -> list[StragglerFinding]:
        """Add every rank's {step: compute seconds} since the last exchange (by rank); score
        the windows that are complete (all their steps, or a later step, seen). `peers` are groups of
        ranks doing the same work. Returns newly flagged ranks only; `flagged` holds all."""
        for rank, steps in enumerate(rows):
            for step, value in steps.items():
                if step // self.window > self._scored:  # a late step of a judged window: out
                    self._steps.setdefault(step, {})[rank] = value
        if not self._steps:
            return []
        counts = Counter(s // self.window for s in self._steps)
        latest = max(counts)
        new: list[StragglerFinding] = []
        for w in sorted(w for w, n in counts.items() if w < latest or n >= self.window):
            window = {s: self._steps.pop(s) for s in sorted(self._steps) if s // self.window == w}
            self._scored = w
            if 2 * len(window) >= self.window:  # a stub (the run began mid-window) says little
                new += self._judge(_window_scores(window, len(rows), peers))
        return new

    def _judge(self, scores: dict[int, tuple[float, float, float]]) -> list[StragglerFinding]:
        """Advance every rank's streak by one window's (slowdown, own, peers') scores."""
        new = []
        for rank, (slowdown, own, others) in scores.items():
            if slowdown >= self.threshold:
                self._streak[rank] = max(0, self._streak.get(rank, 0)) + 1
            else:  # a negative streak counts windows back under the threshold
                self._streak[rank] = min(0, self._streak.get(rank, 0)) - 1
                if self._streak[rank] <= -self.persist:
                    self.flagged.discard(rank)
            if self._streak[rank] >= self.persist and rank not in self.flagged:
                self.flagged.add(rank)
                new.append(StragglerFinding(rank, slowdown, own, others))
        return new


def _window_scores(
    window: dict[int, dict[int, float]], world: int, peers: Sequence[Sequence[int]] | None
) -> dict[int, tuple[float, float, float]]:
    """{rank: (median per-step ratio to its peers, its median value, its peers' median)}."""
    group_of = {r: [q for q in g if q != r] for g in peers or [] for r in g}
    everyone = list(range(world))
    ratios: dict[int, list[float]] = {}
    own: dict[int, list[float]] = {}
    theirs: dict[int, list[float]] = {}
    for values in window.values():
        for rank, value in values.items():
            others = [values[q] for q in group_of.get(rank, everyone) if q != rank and q in values]
            if not others:
                continue
            ref = statistics.median(others)
            ratios.setdefault(rank, []).append(value / ref)
            own.setdefault(rank, []).append(value)
            theirs.setdefault(rank, []).append(ref)
    return {
        r: (statistics.median(x), statistics.median(own[r]), statistics.median(theirs[r]))
        for r, x in ratios.items()
    }
