"""The gang exchange: one small `all_gather` every N steps on a gloo side group.

It carries each rank's window compute time (straggler scoring) and its pending requests (SDC
check, checkpoint), so every rank decides the same thing at the same step, and then, when an
SDC check is due, the digests. The side group is gloo and its tensors live on the host, so it
never touches the accelerator's streams; it is created once, on every rank, when the hooks are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from trainer_hooks.sdc import digest_to_ints, ints_to_digest


class GangExchange:
    def __init__(self, enabled: bool = True) -> None:
        """`enabled=False` (hooks turned off): no side group, every call is local."""
        up = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.active = enabled and up
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1
        self.group = dist.new_group(backend="gloo") if self.active else None

    def gather(self, values: Sequence[float]) -> list[list[float]]:
        if not self.active:
            return [list(values)]
        t = torch.tensor(list(values), dtype=torch.float64)
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t, group=self.group)
        return [o.tolist() for o in out]

    def gather_digests(self, digests: Sequence[str]) -> list[list[str]]:
        """Every rank's digests (the same number on every rank), in one `all_gather`: each
        collective waits for the gang's slowest rank, so an SDC check makes only one."""
        if not self.active:
            return [list(digests)]
        t = torch.tensor([digest_to_ints(d) for d in digests], dtype=torch.int64)
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t, group=self.group)
        return [[ints_to_digest(row) for row in o.tolist()] for o in out]
