"""Phase 3: straggler screen by timed matrix products and a memory-bandwidth copy.

Every rank times the same GEMM and the same large copy. A synchronous job runs at the pace of
its slowest rank, so a rank noticeably slower than the median rank is flagged: its time must be
over `median * (1 + straggler_slowdown)` and more than `k` robust deviations (MAD) out, so a
noisy fleet widens the band instead of flagging ranks at random.

The measurement runs in many short rounds. Within a round every rank times a few products and
copies (its fastest one counts); each rank's time is divided by the round's median rank, and a
rank is scored by the median of those ratios over all rounds. Load that comes and goes on the
machine moves a whole round, not one rank, and cancels out; a GPU that is slow every time
stays slow in every round. Ranks that share one host without GPUs (the simulated fleet) take
turns within a round, so they measure their own arithmetic rather than their neighbours'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from sentinel.burnin.comm import Comm, Compute
from sentinel.burnin.settings import Thresholds
from sentinel.burnin.stats import mad, median, variance

MEMBW_TOLERANCE = 0.25  # memory bandwidth is noisier than GEMMs: only a large drop flags


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


def turn_slots(hosts: Sequence[str], use_gpu: bool) -> list[int]:
    """Which turn each rank measures in: 0 for all on GPUs, else its index on its host."""
    if use_gpu:
        return [0] * len(hosts)
    seen: dict[str, int] = {}
    slots = []
    for h in hosts:
        slots.append(seen.get(h, 0))
        seen[h] = slots[-1] + 1
    return slots


def _samples(
    compute: Compute,
    a: torch.Tensor,
    b: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reps: int,
) -> tuple[list[float], list[float]]:
    """Seconds of each GEMM and GB/s of each copy (read + write), one at a time."""
    compute.matmul(a, b)  # warm caches and kernels
    gemm = [compute.timed(compute.matmul, a, b)[1] for _ in range(reps)]
    compute.copy(dst, src)
    moved = 2 * src.numel() * src.element_size()
    copy = [moved / compute.timed(compute.copy, dst, src)[1] / 1e9 for _ in range(reps)]
    return gemm, copy


def measure(
    comm: Comm,
    compute: Compute,
    slots: Sequence[int],
    size: int,
    rounds: int,
    reps: int,
    membw_bytes: int,
    seed: int,
) -> list[RankTiming]:
    """Every rank's GEMM time and copy bandwidth, gathered on every rank."""
    dtype = torch.bfloat16 if compute.device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=g).to(compute.device, dtype)
    b = torch.randn(size, size, generator=g).to(compute.device, dtype)
    src = torch.ones(membw_bytes // 4, device=compute.device)
    dst = torch.empty_like(src)
    gemm: list[float] = []
    copy: list[float] = []
    error: str | None = None
    for _ in range(rounds):
        for slot in range(max(slots) + 1):
            comm.barrier()
            if slot != slots[comm.rank] or error:
                continue
            try:
                g_s, c_s = _samples(compute, a, b, src, dst, reps)
            except RuntimeError as e:
                error = str(e)
                continue
            gemm.append(min(g_s))
            copy.append(max(c_s))
    mine = RankTiming(error=error) if error else RankTiming(tuple(gemm), tuple(copy))
    return comm.gather_objects(mine)


def round_scores(series: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """Each rank's median over rounds of (its value / the round's median rank)."""
    rounds = min(len(v) for v in series.values())
    ratios: dict[int, list[float]] = {r: [] for r in series}
    for k in range(rounds):
        mid = median([v[k] for v in series.values()])
        for r, v in series.items():
            ratios[r].append(v[k] / mid)
    return {r: median(x) for r, x in ratios.items()}


def _outlier(
    value: float, others: list[float], rel: float, k: float, higher_is_worse: bool
) -> bool:
    """Worse than the other ranks' median by `rel` and by k robust deviations (leave one out:
    in a small gang the suspect's own value would widen the band it is judged against)."""
    if not others:
        return False
    ref, spread = median(others), k * mad(others)
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


def gemm_tflops(size: int, seconds: float) -> float:
    return 2 * size**3 / seconds / 1e12
