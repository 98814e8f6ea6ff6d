"""Step time, split into the rank's own compute and the time it waits on others, without a
host-device sync.

Waiting. A step is the interval between `begin()` and `end()`. Communication is every interval
the stepping thread spends inside a *comm region*: explicit (`with timer.comm(): ...`), or one
of the places where torch blocks on other ranks, which `instrument_collectives` wraps in a comm
region: the synchronous `torch.distributed` collectives and point-to-point calls, every
`Work.wait()` (pipeline send/receive in `torch.distributed.pipelining`, FSDP2's all-gathers and
reduce-scatters, any `async_op=True` collective) and the functional collectives' `wait_tensor`
(DTensor's tensor-parallel all-reduces and all-gathers, forward and backward). That covers
every layout the reference trainer runs: TP, PP, DP all-reduce and FSDP2. Collectives issued
and waited inside C++ (DDP's bucket all-reduce overlapped with backward) stay invisible to it.

Compute. On a CUDA device each boundary records a CUDA event on the current stream: a wait
(`Work.wait`, `wait_tensor`) makes that stream wait for the communication kernel, so the events
around it time the stream's stall, and `compute = step - comm`. Durations are read with
`Event.elapsed_time` only once `Event.query()` says the GPU has passed them, normally a step
later, so the host never waits for the device. On a CPU device the rank's compute is the
stepping thread's own CPU time over the step (`time.thread_time`), less what it spent inside
comm regions: a thread blocked in a gloo wait uses almost no CPU, but waking from every long
wait costs it ~0.1 ms, which would otherwise be charged to the ranks that wait for a straggler,
not to the straggler. Time the scheduler gave to other processes drops out too. On a host shared by several ranks and other work, wall-clock
`step - comm` charges a rank for every preemption; CPU time charges it only for its work.
(Torch's intra-op worker threads are not counted: run CPU ranks with one thread, as the
reference trainer does by default.)
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

Clock = Callable[[], float]


@dataclass(frozen=True)
class StepTiming:
    step: int
    step_s: float
    comm_s: float
    cpu_s: float | None = None  # the stepping thread's CPU time outside waits (CPU devices)

    @property
    def compute_s(self) -> float:
        """The rank's own work: its CPU time on a CPU device, else the step less its waits."""
        if self.cpu_s is not None:
            return self.cpu_s
        return max(0.0, self.step_s - self.comm_s)


@dataclass
class _Pending:
    step: int
    start: Any  # float (CPU) or torch.cuda.Event
    cpu_start: float | None = None
    end: Any = None
    cpu_s: float | None = None
    comm_cpu_s: float = 0.0
    comm: list[tuple[Any, Any]] = field(default_factory=list)


class StepTimer:
    """Collects one `StepTiming` per step; `poll()` returns those that are ready."""

    def __init__(
        self,
        device: torch.device | None = None,
        clock: Clock = time.perf_counter,
        max_pending: int = 64,
        cpu_clock: Clock = time.thread_time,
    ) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self._clock = clock
        self._cpu_clock = None if self.cuda else cpu_clock
        self._current: _Pending | None = None
        self._pending: deque[_Pending] = deque(maxlen=max_pending)
        self._comm_start: Any = None
        self._comm_cpu_start = 0.0
        self.thread: int | None = None  # the thread that steps: only its waits are counted

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
        self.thread = threading.get_ident()
        cpu = self._cpu_clock() if self._cpu_clock else None
        self._current = _Pending(step=step, start=self._mark(), cpu_start=cpu)

    def renumber(self, step: int) -> None:
        """The step under way is `step` (its number changed inside it)."""
        if self._current is not None:
            self._current.step = step

    def end(self) -> None:
        cur = self._current
        if cur is None:
            return
        if self._comm_start is not None:
            self.comm_end()
        cur.end = self._mark()
        if self._cpu_clock and cur.cpu_start is not None:
            cur.cpu_s = max(0.0, self._cpu_clock() - cur.cpu_start - cur.comm_cpu_s)
        self._pending.append(cur)
        self._current = None

    def comm_begin(self) -> None:
        if self._current is not None and self._comm_start is None:
            if self._cpu_clock:
                self._comm_cpu_start = self._cpu_clock()
            self._comm_start = self._mark()

    def comm_end(self) -> None:
        if self._current is not None and self._comm_start is not None:
            self._current.comm.append((self._comm_start, self._mark()))
            if self._cpu_clock:
                self._current.comm_cpu_s += self._cpu_clock() - self._comm_cpu_start
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
            step_s = self._elapsed(p.start, p.end)
            out.append(StepTiming(step=p.step, step_s=step_s, comm_s=comm, cpu_s=p.cpu_s))
        return out

    def _ready(self, p: _Pending) -> bool:
        return not self.cuda or bool(p.end.query())

    def _elapsed(self, a: Any, b: Any) -> float:
        if self.cuda:
            return float(a.elapsed_time(b)) / 1000.0
        return max(0.0, b - a)


# --- wrap the places where torch waits on other ranks in comm regions -----------------------

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
    "send",
    "recv",
)


def _wait_points() -> list[tuple[Any, str]]:
    """(owner, attribute) of every call that blocks on other ranks."""
    points: list[tuple[Any, str]] = [(dist, n) for n in _COLLECTIVES if hasattr(dist, n)]
    # Every async collective and p2p op (pipelining, FSDP2, `async_op=True`) ends in a wait on
    # its work object; DTensor's collectives end in the functional collectives' `wait_tensor`.
    points += [(dist.Work, "wait"), (funcol, "wait_tensor")]
    return points


_active_timer: list[StepTimer] = []
_originals: dict[tuple[Any, str], Callable[..., Any]] = {}


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        # Called for every wait of every step: no context manager (a generator per call), and
        # nothing to do outside a step, inside a comm region already (nested), on another
        # thread (a checkpoint writer's collectives are not this step's waits) or for an async
        # call (its wait is timed).
        timer = _active_timer[0] if _active_timer else None
        if (
            timer is None
            or timer._current is None
            or timer._comm_start is not None
            or kwargs.get("async_op")
            or timer.thread != threading.get_ident()
        ):
            return fn(*args, **kwargs)
        timer.comm_begin()
        try:
            return fn(*args, **kwargs)
        finally:
            timer.comm_end()

    return timed


def instrument_collectives(timer: StepTimer) -> None:
    """Route the time this process's stepping thread waits on other ranks into `timer`'s comm
    regions (see the module's docstring for the calls covered)."""
    _active_timer[:] = [timer]
    for owner, name in _wait_points():
        if (owner, name) in _originals:
            continue
        _originals[(owner, name)] = getattr(owner, name)
        setattr(owner, name, _wrap(_originals[(owner, name)]))


def uninstrument_collectives() -> None:
    for (owner, name), fn in _originals.items():
        setattr(owner, name, fn)
    _originals.clear()
    _active_timer.clear()
