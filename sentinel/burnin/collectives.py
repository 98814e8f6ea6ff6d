"""Phase 1: collective bandwidth over a size sweep, with nccl-tests' formulas and `-c` check.

`bytes` follows nccl-tests: the per-rank buffer size of the larger side of the operation
(all_gather: the gathered output, reduce_scatter: the full input). algbw = bytes / time;
busbw = algbw * factor, the factor making figures comparable with the hardware's link speed.
Data are small integers in float32, so every expected element is exact and a wrong element is a
real corruption, never rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sentinel.burnin.comm import Comm

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")
ELEM = 4  # float32


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw correction (doc/PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def elements(nbytes: int, n: int) -> int:
    """Element count for a buffer of about `nbytes`, divisible by the world size."""
    return max(n, (nbytes // ELEM) // n * n)


@dataclass(frozen=True)
class Case:
    """Buffers of one operation at one size, and how to run and check it."""

    run: Callable[[], None]
    reset: Callable[[], object]
    check: Callable[[], bool]


def _pattern(count: int, mod: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(count, device=device) % mod + 1).to(torch.float32)


def make_case(comm: Comm, op: str, count: int) -> Case:
    n, r, dev = comm.world, comm.rank, comm.device
    pat = _pattern(count, 13, dev)
    if op == "all_reduce":
        buf = torch.empty(count, device=dev)
        want = pat * (n * (n + 1) / 2)
        return Case(
            lambda: comm.all_reduce(buf),
            lambda: buf.copy_(pat * (r + 1)),
            lambda: torch.equal(buf, want),
        )
    chunk = count // n
    if op == "all_gather":
        src = _pattern(chunk, 13, dev) + 100 * r
        out = torch.empty(count, device=dev)
        want = torch.cat([_pattern(chunk, 13, dev) + 100 * k for k in range(n)])
        return Case(
            lambda: comm.all_gather(out, src), lambda: out.zero_(), lambda: torch.equal(out, want)
        )
    if op == "reduce_scatter":
        src = pat * (r + 1)
        out = torch.empty(chunk, device=dev)
        want = pat[r * chunk : (r + 1) * chunk] * (n * (n + 1) / 2)
        return Case(
            lambda: comm.reduce_scatter(out, src),
            lambda: out.zero_(),
            lambda: torch.equal(out, want),
        )
    if op == "all_to_all":
        # chunk d of rank s holds s*n + d (+ the pattern); rank d receives s*n + d from every s
        base = _pattern(chunk, 7, dev)
        src = torch.cat([base + (r * n + d) * 10 for d in range(n)])
        out = torch.empty(count, device=dev)
        want = torch.cat([base + (s * n + r) * 10 for s in range(n)])
        return Case(
            lambda: comm.all_to_all(out, src), lambda: out.zero_(), lambda: torch.equal(out, want)
        )
    if op == "broadcast":
        buf = torch.empty(count, device=dev)
        want = _pattern(count, 251, dev)
        return Case(
            lambda: comm.broadcast(buf, 0),
            lambda: buf.copy_(want) if r == 0 else buf.zero_(),
            lambda: torch.equal(buf, want),
        )
    if op == "sendrecv":
        dst, src_rank = (r + 1) % n, (r - 1) % n
        send = _pattern(count, 5, dev) + 10 * r
        recv = torch.empty(count, device=dev)
        want = _pattern(count, 5, dev) + 10 * src_rank
        return Case(
            lambda: comm.sendrecv(send, dst, recv, src_rank),
            lambda: recv.zero_(),
            lambda: torch.equal(recv, want),
        )
    raise ValueError(f"unknown collective {op!r}")


def time_case(comm: Comm, case: Case, warmup: int, iters: int) -> float:
    """Average seconds per iteration, the slowest rank's (a collective ends when all ranks do)."""
    for _ in range(warmup):
        case.run()
    comm.sync()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        case.run()
    comm.sync()
    return comm.max_float((time.perf_counter() - t0) / iters)


def measure(comm: Comm, op: str, nbytes: int, warmup: int, iters: int) -> dict[str, Any]:
    """One row of the report, with the ranks whose result was wrong (None on non-zero ranks)."""
    count = elements(nbytes, comm.world)
    case = make_case(comm, op, count)
    case.reset()
    case.run()
    comm.sync()
    ok = case.check()
    seconds = time_case(comm, case, warmup, iters)
    bad = [rank for rank, good in enumerate(comm.gather_objects(ok)) if not good]
    size = count * ELEM
    algbw = size / seconds / 1e9
    return {
        "op": op,
        "bytes": size,
        "time_us": round(seconds * 1e6, 1),
        "algbw_gbps": _significant(algbw),
        "busbw_gbps": _significant(algbw * bus_factor(op, comm.world)),
        "correct": not bad,
        "incorrect_ranks": bad,
    }


def _significant(gbps: float, digits: int = 4) -> float:
    """Bandwidth to a few significant digits: a slow link (a small message on a loaded host
    moves well under 0.0001 GB/s) is reported as slow, never rounded to 0."""
    return float(f"{gbps:.{digits}g}")
