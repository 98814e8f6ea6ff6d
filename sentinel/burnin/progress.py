"""One progress bar per phase on stderr; plain lines when stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 24


class Progress:
    def __init__(
        self, phase: str, total: int, enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.phase, self.total, self.enabled = phase, max(1, total), enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self._next_line = 0.0
        self._t0 = time.monotonic()

    def step(self, label: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        frac = self.done / self.total
        if self.tty:
            bar = "#" * int(frac * WIDTH)
            self.stream.write(
                f"\r{self.phase:<12} [{bar:<{WIDTH}}] {self.done}/{self.total} {label[:40]:<40}"
            )
            self.stream.flush()
        elif frac >= self._next_line or self.done == self.total:
            self.stream.write(f"burnin {self.phase}: {self.done}/{self.total} {label}\n")
            self.stream.flush()
            self._next_line = frac + 0.25

    def finish(self, summary: str = "") -> None:
        if not self.enabled:
            return
        line = f"burnin {self.phase}: done in {time.monotonic() - self._t0:.1f}s {summary}"
        self.stream.write(f"\r{line:<{WIDTH + 60}}\n" if self.tty else f"{line}\n")
        self.stream.flush()
