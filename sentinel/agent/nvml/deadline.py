"""A deadline on every NVML call: which call is in flight, since when, seen from another thread.

A call wedged in the driver cannot be interrupted (it sits in C, in the kernel), so the agent
does not try: every pynvml function the backend uses goes through `traced`, which notes the
call's name and start before entering the library and clears it on return. The agent's event
loop reads the note (`CallWatch.stalled`) and, once a call is older than its deadline, turns the
node unhealthy and names the call, while /metrics, the rank socket and the systemd watchdog go
on. The sweep thread is a daemon (`SweepThread`), so a wedged call never blocks shutdown.

The note is one tuple assignment per call (atomic under the GIL): ~0.2 µs, nothing to lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stall:
    call: str
    gpu: int | None
    elapsed_s: float

    def describe(self) -> str:
        where = f" on gpu {self.gpu}" if self.gpu is not None else ""
        return f"NVML call {self.call}{where} has not returned for {self.elapsed_s:.1f} s"


class CallWatch:
    """The call in flight: (name, gpu, monotonic start) or None."""

    __slots__ = ("_current", "gpu")

    def __init__(self) -> None:
        self._current: tuple[str, int | None, float] | None = None
        self.gpu: int | None = None  # the GPU the backend is reading, set by the backend

    def begin(self, name: str) -> None:
        self._current = (name, self.gpu, time.monotonic())

    def end(self) -> None:
        self._current = None

    def in_flight(self, now: float | None = None) -> Stall | None:
        current = self._current
        if current is None:
            return None
        name, gpu, start = current
        return Stall(name, gpu, (time.monotonic() if now is None else now) - start)

    def stalled(self, deadline_s: float, now: float | None = None) -> Stall | None:
        """The call in flight if it is older than `deadline_s`."""
        stall = self.in_flight(now)
        return stall if stall is not None and stall.elapsed_s >= deadline_s else None


def trace(watch: CallWatch, name: str, fn: Callable[..., T]) -> Callable[..., T]:
    @wraps(fn)
    def traced(*args: Any) -> T:
        watch.begin(name)
        try:
            return fn(*args)
        finally:
            watch.end()

    return traced


class TracedLibrary:
    """A module's `nvml*` functions, each wrapped by `trace`; everything else passes through.

    Wrappers are made on first use and cached on the instance, so constants and classes
    (NVMLError, NVML_* codes) cost one attribute lookup as before.
    """

    def __init__(self, module: Any, watch: CallWatch) -> None:
        self._module = module
        self._watch = watch

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if name.startswith("nvml") and callable(attr):
            attr = trace(self._watch, name, attr)
        setattr(self, name, attr)
        return attr


class SweepThread:
    """One daemon thread running the backend's work, in order.

    Unlike a ThreadPoolExecutor, whose workers the interpreter joins at exit, a daemon thread
    wedged in the driver does not keep a stopping agent alive.
    """

    def __init__(self, name: str = "collect") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._idle: tuple[float, Callable[[], None]] | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def when_idle(self, every_s: float, fn: Callable[[], None] | None) -> None:
        """Run `fn` on this thread whenever it has had no work for `every_s`: between sweeps,
        without an event-loop round trip each time. `fn` must not raise; None stops it."""
        self._idle = (every_s, fn) if fn is not None else None
        self._jobs.put((lambda: None, concurrent.futures.Future()))  # wake to pick it up

    def _next(self) -> tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None:
        idle = self._idle
        if idle is None:
            return self._jobs.get()
        try:
            return self._jobs.get(timeout=idle[0])
        except queue.Empty:
            idle[1]()
            return None

    def _run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                continue
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the awaiting coroutine
                fut.set_exception(exc)

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return asyncio.wrap_future(fut)
