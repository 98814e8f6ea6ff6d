"""Step time, split into compute and communication wait, without a host-device sync.

Method. A step is the interval between `begin()` and `end()`. Communication is every interval
spent inside a *comm region*: either explicit (`with timer.comm(): ...` around a collective or
its `.wait()`), or the synchronous `torch.distributed` collectives, which `instrument_collectives`
wraps in a comm region. Because the collectives of a step synchronise the gang, the time a fast
rank spends in them is mostly waiting for the slowest peer, so `compute = step - comm` is the
rank's own work and what straggler scoring compares. Collectives issued inside C++ (DDP's bucket
all-reduce overlapped with backward) are invisible to this method and count as compute; wrap the
loop's explicit collectives or gradient sync to split them.

On CPU both ends are `time.perf_counter()`. On CUDA each boundary records a CUDA event on the
current stream; durations are read with `Event.elapsed_time` only once `Event.query()` says the
GPU has passed them, normally a step later, so the host never waits for the device.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

Clock = Callable[[], float]


@dataclass(frozen=True)
class StepTiming:
    step: int
    step_s: float
    comm_s: float

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.comm_s)


@dataclass
class _Pending:
    step: int
    start: Any  # float (CPU) or torch.cuda.Event
    end: Any = None
    comm: list[tuple[Any, Any]] = field(default_factory=list)


class StepTimer:
    """Collects one `StepTiming` per step; `poll()` returns those that are ready."""

    def __init__(
        self,
        device: torch.device | None = None,
        clock: Clock = time.perf_counter,
        max_pending: int = 64,
    ) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self._clock = clock
        self._current: _Pending | None = None
        self._pending: deque[_Pending] = deque(maxlen=max_pending)
        self._comm_start: Any = None

    @property
    def in_step(self) -> bool:
        return self._current is not None

    def _mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self._clock()

    def begin(self, step: int) -> None:
        self._current = _Pending(step=step, start=self._mark())

    def end(self) -> None:
        if self._current is None:
            return
        if self._comm_start is not None:
            self.comm_end()
        self._current.end = self._mark()
        self._pending.append(self._current)
        self._current = None

    def comm_begin(self) -> None:
        if self._current is not None and self._comm_start is None:
            self._comm_start = self._mark()

    def comm_end(self) -> None:
        if self._current is not None and self._comm_start is not None:
            self._current.comm.append((self._comm_start, self._mark()))
        self._comm_start = None

    @contextlib.contextmanager
    def comm(self) -> Iterator[None]:
        nested = self._comm_start is not None
        if not nested:
            self.comm_begin()
        try:
            yield
        finally:
            if not nested:
                self.comm_end()

    def poll(self) -> list[StepTiming]:
        out = []
        while self._pending and self._ready(self._pending[0]):
            p = self._pending.popleft()
            comm = sum(self._elapsed(a, b) for a, b in p.comm)
            out.append(StepTiming(step=p.step, step_s=self._elapsed(p.start, p.end), comm_s=comm))
        return out

    def _ready(self, p: _Pending) -> bool:
        return not self.cuda or bool(p.end.query())

    def _elapsed(self, a: Any, b: Any) -> float:
        if self.cuda:
            return float(a.elapsed_time(b)) / 1000.0
        return max(0.0, b - a)


# --- optional: wrap torch.distributed's synchronous collectives in comm regions ---------------

_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "gather",
    "scatter",
)
_active_timer: list[StepTimer] = []
_originals: dict[str, Callable[..., Any]] = {}


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        # Called for every collective of every step: no context manager (a generator per
        # call), and nothing to do outside a step, inside a comm region already (nested) or
        # for an async call.
        timer = _active_timer[0] if _active_timer else None
        if (
            timer is None
            or timer._current is None
            or timer._comm_start is not None
            or kwargs.get("async_op")
        ):
            return fn(*args, **kwargs)
        timer.comm_begin()
        try:
            return fn(*args, **kwargs)
        finally:
            timer.comm_end()

    return timed


def instrument_collectives(timer: StepTimer) -> None:
    """Route the synchronous `torch.distributed` collectives' time into `timer`'s comm regions.

    Async calls (`async_op=True`) are left alone: time their `.wait()` with `timer.comm()`.
    """
    _active_timer[:] = [timer]
    for name in _COLLECTIVES:
        if name in _originals or not hasattr(dist, name):
            continue
        _originals[name] = getattr(dist, name)
        setattr(dist, name, _wrap(_originals[name]))


def uninstrument_collectives() -> None:
    for name, fn in _originals.items():
        setattr(dist, name, fn)
    _originals.clear()
    _active_timer.clear()
