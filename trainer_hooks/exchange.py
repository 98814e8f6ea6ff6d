"""The gang exchange: one small `all_gather` every N steps on a gloo side group, never waited on.

It carries each rank's window compute time (straggler scoring) and its pending requests (SDC
check, checkpoint), so every rank decides the same thing at the same step, and then, when an
SDC check is due, the digests. The side group is gloo and its tensors live on the host, so it
never touches the accelerator's streams; it is created once, on every rank, when the hooks are.

Every gather is posted asynchronously (`async_op=True`) and its result taken one hooked step
later: by then the step's own collectives have brought every rank past the post, so the gather
has long finished in gloo's background thread and taking it costs nothing. A synchronous gather
made each exchange step wait for the gang's slowest rank a second time (on a 2-core machine
running 8 ranks, ~12 ms of a ~420 ms step).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import torch
import torch.distributed as dist

from trainer_hooks.sdc import digest_to_ints, ints_to_digest

Row = TypeVar("Row")


class ExchangeRow(NamedTuple):
    """What a rank posts at an exchange: its step window (`straggler.StepLog.take()`) and
    whether it was asked for an SDC check or a checkpoint. On the wire: the window's floats,
    then the two requests as 0.0 / 1.0."""

    window: list[float]
    sdc: bool
    checkpoint: bool

    def values(self) -> list[float]:
        return [*self.window, float(self.sdc), float(self.checkpoint)]

    @classmethod
    def parse(cls, values: Sequence[float]) -> ExchangeRow:
        *window, sdc, checkpoint = values
        return cls(window, bool(sdc), bool(checkpoint))


class Gathered(Generic[Row]):
    """One all_gather in flight: `rows()` waits for it (normally long done) and decodes it."""

    def __init__(self, work: Any, decode: Callable[[], list[Row]]) -> None:
        self._work, self._decode = work, decode

    @classmethod
    def ready(cls, rows: list[Row]) -> Gathered[Row]:
        """Rows already known (one rank, hooks off, or a stand-in gang in tests)."""
        return cls(None, lambda: rows)

    def rows(self, timeout_s: float | None = None) -> list[Row]:
        """Every rank's row, by rank. With `timeout_s`, raises RuntimeError if not done by then."""
        if self._work is not None:
            if timeout_s is None:
                self._work.wait()
            else:
                self._work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        return self._decode()


class GangExchange:
    def __init__(self, enabled: bool = True) -> None:
        """`enabled=False` (hooks turned off): no side group, every call is local."""
        up = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.active = enabled and up
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1
        self.group = dist.new_group(backend="gloo") if self.active else None

    def gather(self, values: Sequence[float]) -> Gathered[list[float]]:
        """Post every rank's `values` (the same length on every rank)."""
        if not self.active:
            return Gathered.ready([list(values)])
        return self._post(torch.tensor(list(values), dtype=torch.float64), torch.Tensor.tolist)

    def gather_digests(self, digests: Sequence[str]) -> Gathered[list[str]]:
        """Post every rank's digests (the same number on every rank), in one `all_gather`."""
        if not self.active:
            return Gathered.ready([list(digests)])
        t = torch.tensor([digest_to_ints(d) for d in digests], dtype=torch.int64)
        return self._post(t, _digests)

    def _post(self, t: torch.Tensor, decode: Callable[[torch.Tensor], Row]) -> Gathered[Row]:
        out = [torch.empty_like(t) for _ in range(self.world)]
        work = dist.all_gather(out, t, group=self.group, async_op=True)
        return Gathered(work, lambda: [decode(o) for o in out])


def _digests(t: torch.Tensor) -> list[str]:
    return [ints_to_digest(row) for row in t.tolist()]
