"""AdamW and a warmup + cosine learning-rate schedule with an optional temporary scale.

The schedule is a pure function of the step, so resuming needs only the step and the active
scale window (`--lr-scale FACTOR:STEPS`, which playbooks use after a rollback), both in the
checkpoint's train state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


def build_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n)]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # foreach=False: DTensor (TP) and plain parameters share a group; the per-tensor path is
    # exact and the model is small.
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)


@dataclass
class LRSchedule:
    peak: float
    floor: float
    warmup: int
    total: int
    scale: float = 1.0
    scale_start: int = 0
    scale_until: int = 0

    def lr(self, step: int) -> float:
        if step < self.warmup:
            base = self.peak * (step + 1) / self.warmup
        else:
            span = max(1, self.total - self.warmup)
            t = min(1.0, (step - self.warmup) / span)
            base = self.floor + 0.5 * (self.peak - self.floor) * (1 + math.cos(math.pi * t))
        return base * (self.scale if self.scale_start <= step < self.scale_until else 1.0)

    def apply(self, opt: torch.optim.Optimizer, step: int) -> float:
        lr = self.lr(step)
        for g in opt.param_groups:
            g["lr"] = lr
        return lr

    def scale_from(self, step: int, factor: float, steps: int) -> None:
        self.scale, self.scale_start, self.scale_until = factor, step, step + steps

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "start": self.scale_start, "until": self.scale_until}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])
        self.scale_start, self.scale_until = int(state["start"]), int(state["until"])
