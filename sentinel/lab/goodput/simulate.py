"""The discrete-event loop: one seeded stream of failures replayed against a recovery model.

Failures arrive on the wall clock as a Poisson process per category (rate = count / window,
scaled by fleet size), whether the job is training or recovering: one that strikes during a
recovery restarts it (its own detection, then whichever replacement node is ready last).
Between failures the job trains in cycles of `interval` training then `cost` checkpointing;
a failure whose path stops every rank (restart, warm restart) loses the training since the last
committed checkpoint: an async save commits `commit lag` seconds into the next cycle, so a
failure in that window loses the cycle before too. A failure on the live path loses nothing:
the survivors stall (`stall`), then step without the lost replica until a spare joins, at the
rate `LiveSpec.throughput` gives (the rest of that time is `degraded`). Every second of wall
time lands in exactly one category of `CATEGORIES`.

The stream of failures depends only on the seed, so every model sees the same failures
(common random numbers): differences between models are the models', not the dice's.
"""

from __future__ import annotations

import bisect
import itertools
import random
import statistics
from dataclasses import dataclass
from itertools import accumulate

from sentinel.lab.goodput.model import LiveSpec, RecoveryModel, RepairPath
from sentinel.lab.goodput.trace import NEEDS_NODE, FaultClass, Trace
from sentinel.lab.goodput.youngdaly import young_daly_interval

CATEGORIES = (
    "useful",
    "rollback",
    "checkpoint",
    "detection",
    "waiting",
    "restart",
    "stall",
    "degraded",
)
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


class _Cycles:
    """Training in cycles of `tau` seconds then a `cost`-second save, with the work a failure
    would roll back: the training since the last save (`current`) and, until the last save
    commits (`lag` seconds after its blocking part), the cycle it saved (`pending`). Each bucket
    holds (useful, degraded) seconds: training while a replica is out is part useful, part lost.
    """

    def __init__(self, acc: dict[str, float], tau: float, cost: float, lag: float) -> None:
        self.acc, self.tau, self.cost, self.lag = acc, tau, cost, lag
        self.pos = 0.0  # seconds into the cycle: [0, tau) training, then the save
        self.current = (0.0, 0.0)
        self.pending = (0.0, 0.0)
        self.commit_in = 0.0

    def _tick(self, dt: float) -> None:
        self.commit_in -= dt
        if self.commit_in <= 0:
            self.pending = (0.0, 0.0)

    def _within(self, dt: float, rate: float) -> None:
        """Advance inside the current cycle (no save completes)."""
        trained = min(dt, max(0.0, self.tau - self.pos))
        useful, degraded = rate * trained, (1 - rate) * trained
        self.acc["useful"] += useful
        self.acc["degraded"] += degraded
        self.acc["checkpoint"] += dt - trained
        self.current = (self.current[0] + useful, self.current[1] + degraded)
        self._tick(dt)
        self.pos += dt

    def _saved(self) -> None:
        u, d = self.pending  # uncommitted still (a lag longer than a cycle): both go back
        self.pending = (u + self.current[0], d + self.current[1])
        self.current, self.pos, self.commit_in = (0.0, 0.0), 0.0, self.lag
        self._tick(0.0)

    def train(self, dt: float, rate: float) -> None:
        period = self.tau + self.cost
        to_save = period - self.pos
        if dt < to_save:
            self._within(dt, rate)
            return
        self._within(to_save, rate)
        self._saved()
        cycles, rest = divmod(dt - to_save, period)
        if cycles:
            self.acc["useful"] += cycles * self.tau * rate
            self.acc["degraded"] += cycles * self.tau * (1 - rate)
            self.acc["checkpoint"] += cycles * self.cost
            # Every save but the last has committed (the interval is at least the lag).
            self.pending = (0.0, 0.0)
            self.current = (self.tau * rate, self.tau * (1 - rate))
            self._saved()
        self._within(rest, rate)

    def idle(self, dt: float) -> None:
        """Time the job is up but no step completes (a stall): the write goes on."""
        self._tick(dt)

    def fail(self) -> None:
        """Roll back to the last committed save."""
        lost_u = self.current[0] + self.pending[0]
        lost_d = self.current[1] + self.pending[1]
        self.acc["useful"] -= lost_u
        self.acc["degraded"] -= lost_d
        self.acc["rollback"] += lost_u + lost_d
        self.current, self.pending, self.pos, self.commit_in = (0.0, 0.0), (0.0, 0.0), 0.0, 0.0


Window = tuple[float, float]


class _Run:
    """One failure stream replayed against one model, booking every second of wall time."""

    def __init__(self, model: RecoveryModel, tau: float) -> None:
        self.model = model
        self.acc = dict.fromkeys(CATEGORIES, 0.0)
        self.cycles = _Cycles(self.acc, tau, model.checkpoint_cost_s, model.checkpoint_commit_lag_s)
        self.pool = _Pool(model)
        self.cursor = 0.0  # booked up to here
        self.up_at, self.pending_node = 0.0, 0.0
        self.phases: Phases = []  # the current full stop's detection, waiting, restart
        self.stalls: list[Window] = []  # the survivors' stalls (live path)
        self.missing: list[Window] = []  # a replica out, from its fault to its spare's join

    def advance(self, t: float) -> None:
        if self.cursor < self.up_at:
            until = min(t, self.up_at)
            for name, start, end in self.phases:
                self.acc[name] += max(0.0, min(end, until) - max(start, self.cursor))
            self.cursor = until
        if self.cursor < t:
            self._up(self.cursor, t)
            self.cursor = t

    def _up(self, a: float, b: float) -> None:
        edges = {x for w in (*self.stalls, *self.missing) for x in w if a < x < b}
        cuts = sorted({a, b, *edges})
        for lo, hi in itertools.pairwise(cuts):
            mid = (lo + hi) / 2
            if any(s <= mid < e for s, e in self.stalls):
                self.acc["stall"] += hi - lo
                self.cycles.idle(hi - lo)
                continue
            out = sum(s <= mid < e for s, e in self.missing)
            rate = 1.0 if not out or self.model.live is None else self.model.live.throughput(out)
            self.cycles.train(hi - lo, rate)
        self.stalls = [w for w in self.stalls if w[1] > b]
        self.missing = [w for w in self.missing if w[1] > b]

    def full_stop(self, at: float, cls: FaultClass) -> None:
        """Every rank stops: the work since the last committed save is lost, then detection,
        a replacement node where the class needs one, and the restart (or warm restart)."""
        self.advance(at)
        if at >= self.up_at:
            self.cycles.fail()
        self.stalls = [(s, min(e, at)) for s, e in self.stalls if s < at]
        detected = at + self.model.detect_s[cls]
        if cls in NEEDS_NODE:
            self.pending_node = max(self.pending_node, self.pool.take(detected))
        ready = max(detected, self.pending_node)
        self.up_at = ready + self.model.resume_s[cls]
        self.phases = [
            ("detection", at, detected),
            ("waiting", detected, ready),
            ("restart", ready, self.up_at),
        ]

    def live(self, at: float, cls: FaultClass, live: LiveSpec) -> None:
        """One replica leaves: the survivors stall, then step without it until a spare has
        joined (they stall again as it joins); nothing is rolled back."""
        self.advance(at)
        detect = self.model.detect_s[cls]
        joined = max(at + detect, self.pool.take(at + detect)) + live.join_s
        self.missing.append((at, joined))
        if at >= self.up_at:
            self.stalls.append((at, at + live.stall_for(detect)))
        self.stalls.append((joined, joined + live.regroup_s))


def run_once(failures: list[Failure], model: RecoveryModel, wall_s: float, tau: float) -> RunResult:
    run = _Run(model, tau)
    for at, cls in failures:
        if model.path_of(cls) == RepairPath.LIVE and model.live is not None:
            run.live(at, cls, model.live)
        else:
            run.full_stop(at, cls)
    run.advance(wall_s)
    return RunResult(seconds=run.acc, interruptions=len(failures))


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

    def rollback_mtbf_s(self, model: RecoveryModel) -> float:
        """Mean time between the failures that roll back (those a live path repairs do not);
        the fleet's MTBF if every class takes the live path."""
        counts = self.trace.counts_by_class()
        full_stop = sum(n for c, n in counts.items() if model.path_of(c) != RepairPath.LIVE)
        return self.mtbf_s * self.trace.total / full_stop if full_stop else self.mtbf_s

    def interval_for(self, model: RecoveryModel) -> float:
        """Seconds of training between saves: Young/Daly over the failures that roll back;
        never shorter than a save takes to commit, as the next save waits for the previous
        write."""
        floor = max(MIN_INTERVAL_S, model.checkpoint_commit_lag_s)
        if model.checkpoint_interval_s is not None:
            return max(floor, model.checkpoint_interval_s)
        mtbf = self.rollback_mtbf_s(model)
        return max(floor, young_daly_interval(model.checkpoint_cost_s, mtbf))

    def evaluate(self, model: RecoveryModel) -> Summary:
        tau = self.interval_for(model)
        runs = [run_once(s, model, self.wall_s, tau) for s in self.streams]
        return Summary(model=model, interval_s=tau, runs=runs)
