"""Counters judged as rates: how many errors in the last window, per minute.

A lifetime count says nothing about now (a link that replayed 10,000 times last month and is
clean today), so PCIe replays, NVLink CRC/replay errors and corrected ECC errors are judged by
how fast they grow. The rate is the increase within `window_s`, divided by the whole window
(not by the time seen so far), so one stray error just after start is not a burst. A counter
that goes down was reset (GPU reset, driver reload): its history starts again.
"""

from __future__ import annotations

from collections import deque


class CounterRates:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: dict[tuple[int, str], deque[tuple[float, int]]] = {}

    def update(self, gpu: int, name: str, value: int | None, now: float) -> float | None:
        """Record one reading; the per-minute rate over the window, None while unknown."""
        key = (gpu, name)
        if value is None:
            self._samples.pop(key, None)
            return None
        samples = self._samples.setdefault(key, deque())
        if samples and value < samples[-1][1]:
            samples.clear()
        samples.append((now, value))
        horizon = now - self.window_s
        while len(samples) > 1 and samples[1][0] <= horizon:
            samples.popleft()  # keep one sample at or before the window's start
        return (value - samples[0][1]) * 60.0 / self.window_s

    def forget(self, gpu: int) -> None:
        for key in [k for k in self._samples if k[0] == gpu]:
            del self._samples[key]
