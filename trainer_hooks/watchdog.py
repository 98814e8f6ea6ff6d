"""Hang watchdog: no step progress for longer than the calibrated timeout -> dump and report.

The timeout follows the run (as NVIDIA Resiliency Extension calibrates its rank heartbeat):
`max(floor_s, k x the longest of the recent step times)`; before the first step completes,
`first_step_s` applies (startup, compilation, the first collective's rendezvous). It fires once
per stall and re-arms when a step completes. The clock is injectable and `check()` is a plain
method, so tests drive time directly; `start()` runs `check()` on a daemon thread.

The thread does not poll: it sleeps until the current deadline (at least `poll_s`, at most
`floor_s`, so a timeout that shrinks while it sleeps is noticed within `floor_s`), and a step
wakes it only when the deadline moves earlier than that: the first completed step after start
or after a stall. On a machine whose cores the ranks already oversubscribe, every wake-up of a
rank's thread takes the GIL and a core from a training process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from sentinel.beacon import Beacon

Clock = Callable[[], float]
OnHang = Callable[[int | None, float, float], None]  # (last step, waited_s, timeout_s)


class HangWatchdog:
    def __init__(
        self,
        on_hang: OnHang,
        *,
        k: float = 5.0,
        floor_s: float = 60.0,
        first_step_s: float = 900.0,
        history: int = 100,
        clock: Clock = time.monotonic,
        poll_s: float = 1.0,
        beacon: Beacon | None = None,
    ) -> None:
        self.on_hang = on_hang
        # What this watchdog knows, mirrored where the node's agent reads it from outside
        # (sentinel/beacon.py): a rank stopped or holding the GIL silences this thread too.
        self.beacon = beacon
        self.k, self.floor_s, self.first_step_s = k, floor_s, first_step_s
        self._clock = clock
        self._poll_s = poll_s
        self._step_times: deque[float] = deque(maxlen=history)
        self._last_progress = clock()
        self.last_step: int | None = None  # the last step that made progress
        self._fired = False
        self._paused = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rearm = threading.Event()  # the deadline moved earlier: the thread recomputes it
        self._thread: threading.Thread | None = None
        self.fired_count = 0

    def timeout_s(self) -> float:
        if not self._step_times:
            return self.first_step_s
        return max(self.floor_s, self.k * max(self._step_times))

    def progress(self, step: int, step_s: float | None = None) -> None:
        with self._lock:
            now = self._clock()
            wake = self._fired or not self._step_times  # first_step_s or a stall ends
            self._step_times.append(step_s if step_s is not None else now - self._last_progress)
            self._last_progress = now
            self.last_step = step
            self._fired = False
            if self.beacon is not None:
                self.beacon.progress(step, self.timeout_s())
        if wake:
            self._rearm.set()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """For known long pauses outside steps (evaluation, a blocking checkpoint)."""
        with self._lock:
            self._paused += 1
            if self.beacon is not None and self._paused == 1:
                self.beacon.pause(True)
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1
                self._last_progress = self._clock()
                if self.beacon is not None and self._paused == 0:
                    self.beacon.pause(False)

    def check(self) -> bool:
        """Fire `on_hang` if the stall exceeds the timeout; True if it fired now."""
        with self._lock:
            if self._fired or self._paused:
                return False
            waited = self._clock() - self._last_progress
            timeout = self.timeout_s()
            if waited <= timeout:
                return False
            self._fired = True
            self.fired_count += 1
            step = self.last_step
            if self.beacon is not None:
                self.beacon.reported(step)
        self.on_hang(step, waited, timeout)
        return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sentinel-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._rearm.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def next_check_in(self) -> float:
        """Seconds the thread may sleep before the stall could exceed the timeout."""
        with self._lock:
            if self._fired or self._paused:
                return self._poll_s
            remaining = self._last_progress + self.timeout_s() - self._clock()
        return min(max(remaining, self._poll_s), max(self.floor_s, self._poll_s))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._rearm.wait(self.next_check_in())
            self._rearm.clear()
            if self._stop.is_set():
                return
            with contextlib.suppress(Exception):
                self.check()
