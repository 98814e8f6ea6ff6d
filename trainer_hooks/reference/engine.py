"""One optimizer step: forward/backward over micro-batches, gradient sync, clip, AdamW.

With pp > 1 a pipeline schedule (1F1B or GPipe) runs the micro-batches; with pp == 1 they run
in a plain loop with the same arithmetic: the micro-batch gradients are summed, then divided by
the step's divisor (the micro-batches of one data-parallel rank in a gang; of the whole global
batch in the fault-tolerant replica mode, whose replicas sum their shares). What happens between
backward and clipping, and whether the optimizer may step, is the `GradSync`'s: a gang's
data-parallel all-reduce, or the replicas' fault-tolerant all-reduce and commit vote.
`StepResult` holds the loss and grad norm as tensors so hooks can read them without a sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from trainer_hooks.reference.model import Transformer, loss_fn
from trainer_hooks.reference.parallelize import (
    PipelineSchedules,
    all_reduce_dp_grads,
    clip_grad_norm,
    local_grad,
)


@dataclass
class StepResult:
    # Mean micro-batch loss (a gang: of this dp rank's share; replicas: of the global batch);
    # None off the last stage.
    loss: torch.Tensor | None
    grad_norm: torch.Tensor  # global, before clipping; the same on every rank
    committed: bool = True  # False: the optimizer did not step; the step is to be run again


class GradSync(Protocol):
    def reduce(self, model: nn.Module, loss: torch.Tensor | None) -> torch.Tensor | None:
        """Combine this rank's gradients (and loss) with the other data-parallel ranks'."""
        ...

    def commit(self) -> bool:
        """Whether the optimizer may apply this step's gradients."""
        ...


class GangSync:
    """One gang: average over the mesh's dp dimension (FSDP2 already reduce-scattered)."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.dp = mesh["dp"]

    def reduce(self, model: nn.Module, loss: torch.Tensor | None) -> torch.Tensor | None:
        if not isinstance(model, FSDPModule):
            all_reduce_dp_grads(model, self.dp)
        return loss

    def commit(self) -> bool:
        return True


class TrainStep:
    def __init__(
        self,
        model: Transformer,
        opt: torch.optim.Optimizer,
        mesh: DeviceMesh,
        schedules: PipelineSchedules | None,
        clip: float,
        autocast: torch.dtype | None,
        sync: GradSync,
    ) -> None:
        self.model, self.opt, self.mesh, self.schedules = model, opt, mesh, schedules
        self.clip, self.autocast, self.sync = clip, autocast, sync
        pp = mesh["pp"]
        # Called just before the optimizer changes parameters (checkpoint staging waits here).
        self.before_update: Callable[[], None] = lambda: None
        self.first = pp.get_local_rank() == 0
        self.last = pp.get_local_rank() == pp.size() - 1

    def _precision(self, device: torch.device) -> contextlib.AbstractContextManager[None]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor, n: int) -> torch.Tensor | None:
        """Sum of the `n` micro-batch losses (None off the last stage); gradients summed."""
        if n == 0:  # a replica with no share this step contributes nothing
            return torch.zeros((), device=x.device) if self.last else None
        if self.schedules is not None:
            schedule = self.schedules(n)
            losses: list[torch.Tensor] = []
            if self.first:
                schedule.step(x)
            elif self.last:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
            return torch.stack([loss.detach() for loss in losses]).sum() if self.last else None
        total = torch.zeros((), device=x.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n), strict=True)):
            if isinstance(self.model, FSDPModule):  # reduce-scatter once, after the last
                self.model.set_requires_gradient_sync(i == n - 1)
            loss = loss_fn(self.model(xm), ym)
            loss.backward()
            total += loss.detach()
        return total

    def __call__(self, tokens: torch.Tensor, microbatches: int, divisor: int) -> StepResult:
        """Train on `microbatches` micro-batches (`tokens` rows, in order); gradients and loss
        are their sums divided by `divisor`. The optimizer steps only if the sync commits."""
        x, y = tokens[:, :-1], tokens[:, 1:]
        with self._precision(x.device):
            total = self._forward_backward(x, y, microbatches)
        with torch.no_grad():
            for p in self.model.parameters():
                g = local_grad(p)
                if g is not None:
                    g.div_(divisor)
        loss = self.sync.reduce(self.model, None if total is None else total / divisor)
        norm = clip_grad_norm(self.model, self.mesh, self.clip)
        committed = self.sync.commit()
        if committed:
            self.before_update()
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return StepResult(loss=loss, grad_norm=norm, committed=committed)
