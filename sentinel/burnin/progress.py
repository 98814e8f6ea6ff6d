"""A phase's progress on rank 0's stderr: a live bar on a terminal, plain lines elsewhere
(`sentinel.live`). `--no-progress` switches it off."""

from __future__ import annotations

from typing import TextIO

from sentinel.live import LiveProgress


class Progress:
    def __init__(
        self, phase: str, total: int, enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.live = LiveProgress("burnin", stream) if enabled else None
        if self.live is not None:
            self.live.phase(phase, total)

    def step(self, label: str = "") -> None:
        if self.live is not None:
            self.live.advance(label)

    def finish(self, summary: str = "") -> None:
        if self.live is not None:
            self.live.finish(summary)
