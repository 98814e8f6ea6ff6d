"""Progress a person can watch: a live display (rich) on a terminal, plain lines otherwise.

On a terminal a bar shows the phase, the step out of the total, the time spent and an estimate
of the time left, with events (an incident opening or closing, a phase's summary) printed above
it as they happen. Written to a file or a pipe, the same calls print plain lines: a phase's start,
a line every quarter of it, its end, and every event; a log reader sees what a person saw.
Burn-in, the demo and `make bench` use it; `--json` output never goes through it.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class LiveProgress:
    """One phase at a time. `terminal` None: decided by whether `stream` is a terminal."""

    def __init__(
        self, prefix: str, stream: TextIO | None = None, terminal: bool | None = None
    ) -> None:
        self.prefix = prefix
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.console = Console(file=self.stream, force_terminal=self.terminal, highlight=False)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._phase, self._total, self._done = "", 1, 0
        self._next_line, self._t0 = 0.0, time.monotonic()

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_bar()

    def phase(self, name: str, total: int) -> None:
        """Start a phase of `total` steps (ending any phase still showing)."""
        self._stop_bar()
        self._phase, self._total, self._done = name, max(1, total), 0
        self._next_line, self._t0 = 0.25, time.monotonic()
        if self.terminal:
            self._bar = Progress(
                TextColumn(f"[bold]{self.prefix}[/] {{task.description:<12}}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[label]}"),
                console=self.console,
            )
            self._bar.start()
            self._task = self._bar.add_task(name, total=self._total, label="")
        else:
            self._plain(f"{name}: started, {self._total} steps")

    def advance(self, label: str = "", to: int | None = None) -> None:
        """One step done (or `to` steps done in all); `label` says which."""
        self._done = self._done + 1 if to is None else to
        if self._bar is not None and self._task is not None:
            # Drawn at once: steps come a few a second at most, and none is skipped.
            self._bar.update(self._task, completed=self._done, label=label[:48], refresh=True)
        elif self._done / self._total >= self._next_line or self._done >= self._total:
            self._plain(f"{self._phase}: {self._done}/{self._total} {label}".rstrip())
            self._next_line = self._done / self._total + 0.25

    def finish(self, summary: str = "") -> None:
        took = time.monotonic() - self._t0
        self._stop_bar()
        self.event(f"{self._phase}: done in {took:.1f}s {summary}".rstrip())

    def event(self, text: str) -> None:
        """A line above the bar (an incident opened or closed, a phase's result)."""
        if self._bar is not None:
            self._bar.console.print(f"{self.prefix} {text}", markup=False)
        else:
            self._plain(text)

    def _plain(self, text: str) -> None:
        self.stream.write(f"{self.prefix} {text}\n")
        self.stream.flush()

    def _stop_bar(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar, self._task = None, None
