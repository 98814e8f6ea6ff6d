"""Phase 3: straggler screen by timed matrix products and a memory-bandwidth copy.

Every rank times the same GEMM and the same large copy. A synchronous job runs at the pace of
its slowest rank, so a rank noticeably slower than the median rank is flagged: its time must be
over `median * (1 + straggler_slowdown)` and more than `k` robust deviations (MAD) out, so a
noisy fleet widens the band instead of flagging ranks at random.

The measurement runs in many short rounds, all ranks at once (a barrier starts every timed
operation): every rank times a few products or copies on its own device clock (`Compute.clock`;
its fastest one counts), each rank's time is divided by the median of the round's other ranks,
and a rank is scored by the median of those ratios over all rounds. The ranks of a round are
measured under the same conditions, so load that comes and goes on the machine moves the whole
round and cancels out; a GPU that is slow every time stays slow in every round. Ranks that
share a host without GPUs (the simulated fleet) can measure at once because their clock is
their own CPU time: time-sharing the cores does not count, only the work each rank did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from sentinel.burnin.comm import Comm, Compute
from sentinel.burnin.settings import Thresholds
from sentinel.stats import MAD_SCALE, mad, median, variance

MEMBW_TOLERANCE = 0.25  # memory bandwidth is noisier than GEMMs: only a large drop flags
COPY_ROUND_SHARE = 8  # copy rounds: one per 8 GEMM rounds (a 25% drop needs few samples) ...
COPY_MIN_ROUNDS = 8  # ... and at least this many


@dataclass(frozen=True)
class RankTiming:
    gemm_rounds: tuple[float, ...] = ()  # seconds per product, fastest of each round
    membw_rounds: tuple[float, ...] = ()  # GB/s per copy, fastest of each round
    error: str | None = None

    @property
    def gemm_s(self) -> float:
        return median(self.gemm_rounds) if self.gemm_rounds else math.nan

    @property
    def membw_gbps(self) -> float:
        return median(self.membw_rounds) if self.membw_rounds else math.nan


def _rounds(
    comm: Comm,
    compute: Compute,
    rounds: int,
    reps: int,
    op: Callable[[], object],
    error: str | None = None,
) -> tuple[list[float], str | None]:
    """Seconds of the fastest of `reps` timed `op`s in each round, after one that warms caches.

    Every operation starts at a barrier, so all ranks' operations overlap alike: otherwise a
    slow rank would finish its last ones alone, on a machine its peers have left, and look
    faster than it is (CPU ranks share cores and caches; measured, a 1.05x rank scored
    1.02-1.04 with one barrier per round, 1.057-1.059 with one per operation). After a device
    error this rank only keeps the barriers, so the gang stays in step."""
    out: list[float] = []
    for _ in range(rounds):
        best = math.inf
        for k in range(reps + 1):
            comm.barrier()
            if error:
                continue
            try:
                if k:
                    best = min(best, compute.timed(op)[1])
                else:
                    op()
            except RuntimeError as e:
                error = str(e)
        if not error:
            out.append(best)
    return out, error


def measure(
    comm: Comm,
    compute: Compute,
    size: int,
    rounds: int,
    reps: int,
    membw_bytes: int,
    seed: int,
) -> list[RankTiming]:
    """Every rank's GEMM time and copy bandwidth, gathered on every rank.

    Products and copies run in rounds of their own, so a rank's product never shares the
    machine with another rank's copy (a copy loads memory bandwidth that a product needs).
    Bandwidth is judged against a wide tolerance and needs fewer rounds.
    """
    dtype = torch.bfloat16 if compute.device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=g).to(compute.device, dtype)
    b = torch.randn(size, size, generator=g).to(compute.device, dtype)
    src = torch.ones(membw_bytes // 4, device=compute.device)
    dst = torch.empty_like(src)
    gemm, error = _rounds(comm, compute, rounds, reps, lambda: compute.matmul(a, b))
    copy_rounds = max(COPY_MIN_ROUNDS, rounds // COPY_ROUND_SHARE)
    copy_s, error = _rounds(comm, compute, copy_rounds, reps, lambda: compute.copy(dst, src), error)
    moved = 2 * src.numel() * src.element_size()  # read + write
    copy = [moved / x / 1e9 for x in copy_s]
    mine = RankTiming(error=error) if error else RankTiming(tuple(gemm), tuple(copy))
    return comm.gather_objects(mine)


def round_scores(series: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """Each rank's median over rounds of (its value / the median of the round's other ranks).

    The other ranks only: in a small gang a slow rank is usually the round's slowest, so a
    median that counted it would be an upper one of its healthy peers, and the rank's own
    slowness would raise the line it is measured against (four CPU ranks, one 1.10x: scored
    1.067-1.087 that way, 1.089-1.118 against the others)."""
    rounds = min(len(v) for v in series.values())
    ratios: dict[int, list[float]] = {r: [] for r in series}
    for k in range(rounds):
        order = sorted(series, key=lambda r: series[r][k])
        ranked = [series[r][k] for r in order]
        for i, r in enumerate(order):
            ratios[r].append(ranked[i] / _median_without(ranked, i) if len(ranked) > 1 else 1.0)
    return {r: median(x) for r, x in ratios.items()}


def _median_without(ranked: Sequence[float], i: int) -> float:
    """The median of sorted `ranked` with its element `i` left out, without copying it (a
    2,048-rank gang scores every rank of every round)."""

    def at(j: int) -> float:  # element j of the list without element i
        return ranked[j if j < i else j + 1]

    n = len(ranked) - 1
    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _outlier(
    value: float, others: list[float], rel: float, k: float, higher_is_worse: bool
) -> bool:
    """Worse than the other ranks' median by `rel` and by k robust deviations (leave one out:
    in a small gang the suspect's own value would widen the band it is judged against)."""
    if not others:
        return False
    ref, spread = median(others), k * mad(others, scale=MAD_SCALE)
    if higher_is_worse:
        return value > ref * (1 + rel) and value - ref > spread
    return value < ref * (1 - rel) and ref - value > spread


def judge(
    timings: Sequence[RankTiming],
    th: Thresholds,
    baseline_gemm_s: float | None = None,
) -> tuple[list[int], dict[int, str]]:
    """Straggler ranks and a reason for each (errors included: a GPU that faults is out)."""
    ok = {r: t for r, t in enumerate(timings) if t.error is None and t.gemm_rounds}
    reasons = {r: f"GEMM failed: {t.error}" for r, t in enumerate(timings) if t.error}
    if not ok:
        return sorted(reasons), reasons
    gemm = round_scores({r: t.gemm_rounds for r, t in ok.items()})
    # bandwidth: invert so that higher is worse, like time
    copy = round_scores({r: [1 / x for x in t.membw_rounds] for r, t in ok.items()})
    k = th.straggler_mad_k
    for r, t in ok.items():
        others = [v for q, v in gemm.items() if q != r]
        if _outlier(gemm[r], others, th.straggler_slowdown, k, higher_is_worse=True):
            slow = gemm[r] / median(others) - 1
            reasons[r] = (
                f"GEMM {t.gemm_s * 1e3:.2f} ms is {slow:+.1%} against the other ranks "
                f"(median over {len(t.gemm_rounds)} rounds)"
            )
        elif _outlier(copy[r], [v for q, v in copy.items() if q != r], MEMBW_TOLERANCE, k, True):
            reasons[r] = f"memory bandwidth {t.membw_gbps:.1f} GB/s is low against the others"
        elif baseline_gemm_s and variance(t.gemm_s, baseline_gemm_s) > th.baseline_tolerance:
            reasons[r] = (
                f"GEMM {t.gemm_s * 1e3:.2f} ms is "
                f"{variance(t.gemm_s, baseline_gemm_s):+.0%} against baseline"
            )
    return sorted(reasons), reasons


def near_the_line(timings: Sequence[RankTiming], th: Thresholds) -> list[int]:
    """Ranks one pass put past half the slowdown threshold without flagging them.

    One pass's score has noise of its own (a loaded shared host moves a 40-round score by a few
    percent), so a GPU slow by about the threshold can land just under it. Such a rank is
    measured again and judged on both passes pooled, like a flagged one: a sequential test,
    which halves the noise where the decision is close instead of taking the first pass's word.
    """
    ok = {r: t.gemm_rounds for r, t in enumerate(timings) if t.error is None and t.gemm_rounds}
    if len(ok) < 2:
        return []
    gemm = round_scores(ok)
    out = []
    for r, score in gemm.items():
        ref = median([v for q, v in gemm.items() if q != r])
        if score > ref * (1 + th.straggler_slowdown / 2):
            out.append(r)
    return out


def pooled(first: Sequence[RankTiming], second: Sequence[RankTiming]) -> list[RankTiming]:
    """Two passes' rounds as one measurement; a rank that failed in either stays failed."""
    return [
        a
        if a.error
        else b
        if b.error
        else RankTiming(a.gemm_rounds + b.gemm_rounds, a.membw_rounds + b.membw_rounds)
        for a, b in zip(first, second, strict=True)
    ]


def confirm(
    flagged: Sequence[int],
    both: Sequence[RankTiming],
    th: Thresholds,
    baseline_gemm_s: float | None = None,
) -> dict[int, str]:
    """Which suspects (the first pass's slow ranks, and those near the line) are flagged
    over both passes' rounds pooled.

    A slow GPU is slow every time; a busy moment is not. Judged on the pooled rounds, a rank
    stays flagged only if it was slow by the threshold in most of the rounds of both passes
    (the score is a median), so one busy pass cannot flag it alone. Asking each pass on its own
    to clear the threshold instead would square the chance of missing a GPU that sits near
    it (1.05x against 4%); pooling halves the noise instead.
    """
    again, why = judge(both, th, baseline_gemm_s)
    rounds = min(len(t.gemm_rounds) for t in both if t.error is None)
    return {
        r: f"{why[r]}; confirmed over two passes ({rounds} rounds)" for r in flagged if r in again
    }


def gemm_tflops(size: int, seconds: float) -> float:
    return 2 * size**3 / seconds / 1e12
