"""The seams measurement code talks through: communication and compute.

`Comm` is a thin shell over torch.distributed and `Compute` over the device's arithmetic. The
fault module subclasses them to slow a link, a GPU or corrupt a result in a simulated fleet;
the phases cannot tell the difference and measure whatever they get.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

# torch 2.13 renamed the tensor forms; older releases (>= 2.8 is supported) have only these.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Comm:
    def __init__(self, rank: int, world: int, node_of: list[str], device: torch.device) -> None:
        self.rank = rank
        self.world = world
        self.node_of = node_of  # node name of every global rank
        self.device = device

    @property
    def node(self) -> str:
        return self.node_of[self.rank]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        dist.barrier()

    def gather_objects(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def max_float(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    # Collectives. Each returns after the operation completed on this rank.
    def all_reduce(self, t: torch.Tensor) -> None:
        dist.all_reduce(t)

    def all_gather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        _all_gather(out, t)

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor) -> None:
        _reduce_scatter(out, t)

    def all_to_all(self, out: torch.Tensor, t: torch.Tensor) -> None:
        dist.all_to_all_single(out, t)

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        dist.broadcast(t, src=src)

    def sendrecv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """Send to one peer while receiving from another (possibly the same) peer."""
        for req in (dist.isend(send, dst), dist.irecv(recv, src)):
            if req is not None:
                req.wait()


class Compute:
    """Matrix products and memory copies on this rank's device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def clock(self) -> float:
        """The device's own busy time, in seconds from an arbitrary start.

        On a GPU: wall time around synchronized work, as the device runs nothing else. On CPU
        ranks (simulated GPUs): this process's CPU time, which counts the work the rank did
        (on whichever of torch's threads) and not the time the scheduler gave to other
        processes: on a shared 2-core machine wall time put a healthy rank's GEMM several
        percent off its peers, as much as the slowdown the screen must find."""
        if self.device.type == "cuda":
            return time.perf_counter()
        return time.process_time()

    def timed(self, fn: Any, *args: Any) -> tuple[Any, float]:
        self.sync()
        t0 = self.clock()
        out = fn(*args)
        self.sync()
        return out, self.clock() - t0
