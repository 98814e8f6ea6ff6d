"""One optimizer step: forward/backward over micro-batches, DP all-reduce, clip, AdamW.

With pp > 1 the pipeline schedule (1F1B or GPipe) runs the micro-batches; with pp == 1 they run
in a plain loop with the same arithmetic (sum of micro-batch gradients, then / micro-batches).
`StepResult` holds the loss and grad norm as tensors so hooks can read them without a sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from trainer_hooks.reference.model import Transformer, loss_fn
from trainer_hooks.reference.parallelize import all_reduce_dp_grads, clip_grad_norm, local_grad


@dataclass
class StepResult:
    loss: torch.Tensor | None  # mean micro-batch loss of this dp replica; None off the last stage
    grad_norm: torch.Tensor  # global, before clipping; the same on every rank


class TrainStep:
    def __init__(
        self,
        model: Transformer,
        opt: torch.optim.Optimizer,
        mesh: DeviceMesh,
        schedule: PipelineScheduleSingle | None,
        accum: int,
        clip: float,
        autocast: torch.dtype | None,
    ) -> None:
        self.model, self.opt, self.mesh, self.schedule = model, opt, mesh, schedule
        self.accum, self.clip, self.autocast = accum, clip, autocast
        pp = mesh["pp"]
        # Called just before the optimizer changes parameters (checkpoint staging waits here).
        self.before_update: Callable[[], None] = lambda: None
        self.first = pp.get_local_rank() == 0
        self.last = pp.get_local_rank() == pp.size() - 1

    def _precision(self, device: torch.device) -> contextlib.AbstractContextManager[None]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            if self.first:
                self.schedule.step(x)
            elif self.last:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
            return torch.stack([loss.detach() for loss in losses]).mean() if self.last else None
        total = torch.zeros((), device=x.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(self.accum), y.chunk(self.accum), strict=True)):
            if isinstance(self.model, FSDPModule):  # reduce-scatter once, after the last
                self.model.set_requires_gradient_sync(i == self.accum - 1)
            loss = loss_fn(self.model(xm), ym)
            loss.backward()
            total += loss.detach()
        with torch.no_grad():
            for p in self.model.parameters():
                g = local_grad(p)
                if g is not None:
                    g.div_(self.accum)
        return total / self.accum

    def __call__(self, tokens: torch.Tensor) -> StepResult:
        x, y = tokens[:, :-1], tokens[:, 1:]
        with self._precision(x.device):
            loss = self._forward_backward(x, y)
        if not isinstance(self.model, FSDPModule):  # FSDP2 already reduce-scattered
            all_reduce_dp_grads(self.model, self.mesh["dp"])
        norm = clip_grad_norm(self.model, self.mesh, self.clip)
        self.before_update()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return StepResult(loss=loss, grad_norm=norm)
