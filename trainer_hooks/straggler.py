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
Steps are grouped into windows of `window` steps; a window's ratio is the median of its
per-step ratios, so a burst of interference shorter than half a window (a neighbour's job, the
rank's own garbage collection) does not move it.

Against its own normal. Ranks doing the same work are not equally fast: GPUs of one model
differ by a few percent in their clocks under a power cap, and on a CPU device one process may
run a steady few percent above its peers (on the development VM a healthy rank 0 ran 2-5% above
its stage peers in every window of every clean run, cause unknown). Judged against 1.0, such a
rank is a straggler for as long as it lives; what marks a straggler is a rank that *became*
slower than its peers. So every rank's first `baseline` windows set its normal, the median of
their ratios, and from then on a window's slowdown is its ratio over that normal. The normal
goes on learning: each window that leaves the rank's last `persist` while it is not flagged
joins it, up to `history` windows (500 steps at the defaults), after which it stays fixed, so a
slow drift later on is still measured against it. A normal set on few windows carries their
slow noise: on the development VM with another process on the ranks' core, a clean rank 0 read
1.00-1.03 over its first three windows and 1.05-1.08 in three of the next four, and the old
three-window normal named it at 1.07. Replayed offline over 23 recorded DP4 runs (5 of them
loaded), the four-window, learning normal names no clean rank and every 1.05x rank as soon as
before; it does not remove every case (benchmarks.md: one healthy rank named in 5 DP4 runs).
A normal under 1.0 counts as 1.0 (a rank faster than its peers that slows to their pace holds
nobody up), one over `baseline_max` as `baseline_max`: a rank slower than that from its first
steps is still judged, against `baseline_max` (screening such a device before launch is
burn-in's job). A slowdown that starts inside the baseline's windows leaves the normal alone
while under half of those windows are slow. The peers' median counts each peer over its own
normal, so one steady fast or slow peer does not shift the reference the others are compared
with.

Persistence. A rank is flagged once, when either holds over its last `persist` windows:
- `over` of them are at or above `threshold` (each window's ratio over the rank's normal);
- or, while none of them reaches `acted_on` (the catalog's level for a repair), the mean of the
  middle half of their per-step slowdowns (`persist * window` steps, a quarter of the highest and
  of the lowest left out) is at or above `threshold`.
It is cleared once all of its last `persist` windows are under `threshold`. A flagged rank
reports once more, and only once, when its slowdown grows to the repair's level: `over` of its
last `persist` windows at or above `acted_on`, the last of them too (a GPU named at 1.05x that
degrades to 1.5x is then seen by the playbook that swaps it, which acts from `acted_on`).

A window's ratio moves with noise that is slow, not step to step (on the development VM its spread was 0.031,
0.024, 0.021 and 0.021 for windows of 5, 10, 20 and 40 steps): a 1.05x straggler's windows
averaged 1.052 with a spread of 0.021, 14% of them under 1.03, and "3 of 4" alone missed such a
straggler within 100 steps in about one run in sixteen (more in the loaded test suite). The
pooled estimate uses all four windows' steps and is what names a small slowdown reliably; the
burst of one window moves nothing in it. It is kept below `acted_on` because a pooled estimate
is a blend: two windows of a 1.5x burst among four would read 1.25, and a 1.25x straggler two
windows in would read about 1.12 and be flagged once, under the level that repairs it. A rank
at the repair's level is named by "3 of 4", with its window's own ratio, as before. The ranks a
straggler holds up need no special care: their waits are not in their compute. With the
defaults (window 20, baseline 4, over 3 of persist 4, threshold 1.03) a rank is judged from its
81st step, and a persistent 5% straggler is flagged 40-80 steps after its slowdown starts.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sentinel.faults.catalog import STRAGGLER


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
        over: int = 3,
        baseline: int = 4,
        baseline_max: float = 1.10,
        acted_on: float = STRAGGLER.acted_on,
        history: int = 25,
    ) -> None:
        self.threshold, self.persist, self.window, self.over = threshold, persist, window, over
        self.baseline, self.baseline_max, self.acted_on = baseline, baseline_max, acted_on
        self.history = history
        self._steps: dict[int, dict[int, float]] = {}  # step -> {rank: compute seconds}
        self._scored = -1  # the last window judged (windows are step // window)
        self._recent: dict[int, deque[Judged]] = {}  # rank -> its last `persist` windows
        self._normal_of: dict[int, list[float]] = {}  # rank -> the window ratios of its normal
        self.normal: dict[int, float] = {}  # rank -> its settled ratio to its peers
        self.flagged: dict[int, float] = {}  # rank -> the slowdown it last reported

    def update(
        self, rows: Sequence[dict[int, float]], peers: Sequence[Sequence[int]] | None = None
    ) -> list[StragglerFinding]:
        """Add every rank's {step: compute seconds} since the last exchange (by rank); score
        the windows that are complete (all their steps, or a later step, seen). `peers` are groups of
        ranks doing the same work. Returns newly flagged ranks, and flagged ones whose slowdown
        grew to `acted_on`; `flagged` holds all."""
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
                new += self._judge(_window_scores(window, len(rows), peers, self.normal))
        return new

    def _judge(self, scores: dict[int, WindowScore]) -> list[StragglerFinding]:
        """Judge every settled rank on one more window; a rank still settling adds the
        window's ratio to its normal instead."""
        new = []
        for rank, score in scores.items():
            of_normal = self._normal_of.setdefault(rank, [])
            recent = self._recent.setdefault(rank, deque(maxlen=self.persist))
            if rank not in self.normal:
                of_normal.append(score.ratio)
                if len(of_normal) == self.baseline:
                    self.normal[rank] = statistics.median(of_normal)
                continue
            refining = len(of_normal) < self.history and rank not in self.flagged
            if refining and len(recent) == self.persist:  # the window leaving the judged ones
                of_normal.append(recent[0].ratio)
                self.normal[rank] = statistics.median(of_normal)
            normal = min(max(self.normal[rank], 1.0), self.baseline_max)
            recent.append(
                Judged(score.ratio / normal, [r / normal for r in score.ratios], score.ratio)
            )
            reported = self.flagged.get(rank)
            if reported is None:
                slowdown = self._slowdown(recent)
            else:  # named already: once more only if it grew to the repair's level
                slowdown = self._grown(recent) if reported < self.acted_on else None
            if slowdown is not None:
                self.flagged[rank] = slowdown
                new.append(StragglerFinding(rank, slowdown, score.own, score.peers))
            elif len(recent) == self.persist and all(j.slowdown < self.threshold for j in recent):
                self.flagged.pop(rank, None)
        return new

    def _grown(self, recent: deque[Judged]) -> float | None:
        """A named rank's slowdown once `over` of its last windows, the last among them, are
        at or above `acted_on`; else None."""
        windows = [j.slowdown for j in recent]
        if windows[-1] >= self.acted_on and sum(w >= self.acted_on for w in windows) >= self.over:
            return windows[-1]
        return None

    def _slowdown(self, recent: deque[Judged]) -> float | None:
        """The slowdown a rank's last windows flag it at (the module's docstring), or None."""
        windows = [j.slowdown for j in recent]
        if sum(w >= self.threshold for w in windows) >= self.over:
            return windows[-1]
        if len(recent) < self.persist or max(windows) >= self.acted_on:
            return None
        pooled = interquartile_mean([r for j in recent for r in j.steps])
        return pooled if pooled >= self.threshold else None


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half (a quarter of the values left out at each end)."""
    ordered = sorted(values)
    cut = len(ordered) // 4
    return statistics.fmean(ordered[cut : len(ordered) - cut])


class Judged(NamedTuple):
    """One of a rank's judged windows."""

    slowdown: float  # its ratio over the rank's normal
    steps: list[float]  # its per-step ratios over the normal
    ratio: float  # its ratio to the peers (what joins the normal when it leaves unflagged)


@dataclass(frozen=True)
class WindowScore:
    ratios: list[float]  # the rank's value over its peers' median, step by step
    ratio: float  # their median
    own: float  # the rank's median value
    peers: float  # its peers' median


def _window_scores(
    window: dict[int, dict[int, float]],
    world: int,
    peers: Sequence[Sequence[int]] | None,
    normal: dict[int, float],
) -> dict[int, WindowScore]:
    """Every rank's score over one window's steps. Each peer's value counts over its own
    `normal`: a peer that always runs 4% above the rest would otherwise raise the median that
    every other rank is compared with."""
    group_of = {r: [q for q in g if q != r] for g in peers or [] for r in g}
    everyone = list(range(world))
    ratios: dict[int, list[float]] = {}
    own: dict[int, list[float]] = {}
    theirs: dict[int, list[float]] = {}
    for values in window.values():
        for rank, value in values.items():
            group = group_of.get(rank, everyone)
            others = [values[q] / normal.get(q, 1.0) for q in group if q != rank and q in values]
            if not others:
                continue
            ref = statistics.median(others)
            ratios.setdefault(rank, []).append(value / ref)
            own.setdefault(rank, []).append(value)
            theirs.setdefault(rank, []).append(ref)
    return {
        r: WindowScore(
            x, statistics.median(x), statistics.median(own[r]), statistics.median(theirs[r])
        )
        for r, x in ratios.items()
    }
