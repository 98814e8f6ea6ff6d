"""The discrete-event loop: one seeded stream of failures replayed against a recovery model.

Failures arrive on the wall clock as a Poisson process per category (rate = count / window,
scaled by fleet size), whether the job is training or recovering: one that strikes during a
recovery restarts it (its own detection, then whichever replacement node is ready last).
Between failures the job trains in cycles of `interval` training then `cost` checkpointing;
a failure loses the training since the last committed checkpoint: an async save commits
`commit lag` seconds into the next cycle, so a failure in that window loses the cycle before
too. Every second of wall time lands in exactly one category of `CATEGORIES`.

The stream of failures depends only on the seed, so every model sees the same failures
(common random numbers): differences between models are the models', not the dice's.
"""

from __future__ import annotations

import bisect
import random
import statistics
from dataclasses import dataclass
from itertools import accumulate

from sentinel.goodput.model import RecoveryModel
from sentinel.goodput.trace import NEEDS_NODE, FaultClass, Trace
from sentinel.goodput.youngdaly import young_daly_interval

CATEGORIES = ("useful", "rollback", "checkpoint", "detection", "waiting", "restart")
MIN_INTERVAL_S = 1.0

Failure = tuple[float, FaultClass]
Phases = list[tuple[str, float, float]]


def draw_failures(trace: Trace, gpus: int, wall_s: float, seed: int) -> list[Failure]:
    rng = random.Random(seed)
    rate = trace.rate_per_s(gpus)
    cum = list(accumulate(c.count for c in trace.categories))
    out: list[Failure] = []
    t = rng.expovariate(rate)
    while t < wall_s:
        pick = bisect.bisect_right(cum, rng.random() * cum[-1])
        out.append((t, trace.categories[pick].fault_class))
        t += rng.expovariate(rate)
    return out


@dataclass(frozen=True)
class RunResult:
    seconds: dict[str, float]
    interruptions: int

    @property
    def ratio(self) -> float:
        return self.seconds["useful"] / sum(self.seconds.values())


class _Pool:
    """Hot spares: each slot holds the time its node is (back) in the pool."""

    def __init__(self, model: RecoveryModel) -> None:
        self.ready = [0.0] * model.spares
        self.repair_s = model.node_repair_s
        self.manual_s = model.manual_replace_s

    def take(self, t: float) -> float:
        """A replacement node for a failure detected at t; returns when it is in place."""
        manual = t + self.manual_s
        if not self.ready:
            return manual
        i = min(range(len(self.ready)), key=self.ready.__getitem__)
        back = self.ready[i]
        if back > manual:  # every spare is in repair for longer than a manual swap takes
            return manual
        self.ready[i] = t + self.repair_s  # the broken node comes back as a spare
        return max(t, back)


def _train(
    acc: dict[str, float], elapsed: float, tau: float, model: RecoveryModel, failed: bool
) -> None:
    cost = model.checkpoint_cost_s
    cycles, rest = divmod(elapsed, tau + cost)
    acc["useful"] += cycles * tau
    acc["checkpoint"] += cycles * cost + max(0.0, rest - tau)
    done = min(rest, tau)  # training since the last completed save
    acc["rollback" if failed else "useful"] += done
    if failed and cycles and rest < model.checkpoint_commit_lag_s:
        # The last save was still being written: back to the one before it.
        acc["useful"] -= tau
        acc["rollback"] += tau


def _down(acc: dict[str, float], phases: Phases, until: float) -> None:
    for name, start, end in phases:
        acc[name] += max(0.0, min(end, until) - start)


def run_once(failures: list[Failure], model: RecoveryModel, wall_s: float, tau: float) -> RunResult:
    acc = dict.fromkeys(CATEGORIES, 0.0)
    pool = _Pool(model)
    up_at, pending = 0.0, 0.0
    phases: Phases = []
    for at, cls in failures:
        if at >= up_at:
            _down(acc, phases, up_at)
            _train(acc, at - up_at, tau, model, failed=True)
        else:
            _down(acc, phases, at)
        detected = at + model.detect_s[cls]
        if cls in NEEDS_NODE:
            pending = max(pending, pool.take(detected))
        ready = max(detected, pending)
        up_at = ready + model.resume_s[cls]
        phases = [
            ("detection", at, detected),
            ("waiting", detected, ready),
            ("restart", ready, up_at),
        ]
    _down(acc, phases, min(up_at, wall_s))
    if up_at < wall_s:
        _train(acc, wall_s - up_at, tau, model, failed=False)
    return RunResult(seconds=acc, interruptions=len(failures))


@dataclass(frozen=True)
class Summary:
    model: RecoveryModel
    interval_s: float
    runs: list[RunResult]

    @property
    def ratios(self) -> list[float]:
        return [r.ratio for r in self.runs]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.ratios)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.ratios) if len(self.runs) > 1 else 0.0

    def mean_seconds(self) -> dict[str, float]:
        return {k: statistics.fmean(r.seconds[k] for r in self.runs) for k in CATEGORIES}

    def mean_interruptions(self) -> float:
        return statistics.fmean(r.interruptions for r in self.runs)


class Fleet:
    """One trace on one fleet for one window, with the failure streams of every seed drawn once."""

    def __init__(self, trace: Trace, gpus: int, days: float, seeds: list[int]) -> None:
        self.trace, self.gpus, self.days = trace, gpus, days
        self.wall_s = days * 86400.0
        self.mtbf_s = 1.0 / trace.rate_per_s(gpus)
        self.streams = [draw_failures(trace, gpus, self.wall_s, s) for s in seeds]

    def mean_by_class(self) -> dict[str, float]:
        """Mean simulated interruptions per fault class over the seeds."""
        n = len(self.streams)
        return {str(k): sum(c == k for s in self.streams for _, c in s) / n for k in FaultClass}

    @property
    def expected_interruptions(self) -> float:
        return self.wall_s / self.mtbf_s

    def interval_for(self, model: RecoveryModel) -> float:
        """Seconds of training between saves; never shorter than a save takes to commit, as
        the next save waits for the previous write."""
        floor = max(MIN_INTERVAL_S, model.checkpoint_commit_lag_s)
        if model.checkpoint_interval_s is not None:
            return max(floor, model.checkpoint_interval_s)
        return max(floor, young_daly_interval(model.checkpoint_cost_s, self.mtbf_s))

    def evaluate(self, model: RecoveryModel) -> Summary:
        tau = self.interval_for(model)
        runs = [run_once(s, model, self.wall_s, tau) for s in self.streams]
        return Summary(model=model, interval_s=tau, runs=runs)
