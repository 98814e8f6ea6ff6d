"""The exclude-list file a launcher reads: one node name a line (the default backend)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from sentinel.coordinator.core.effects import EvictionBackend


class ExcludeFileBackend(EvictionBackend):
    name = "exclude_file"

    def __init__(self, path: Path) -> None:
        self.path = path

    def nodes(self) -> list[str]:
        if not self.path.exists():
            return []
        return [ln.strip() for ln in self.path.read_text().splitlines() if ln.strip()]

    def is_evicted(self, node: str) -> bool:
        return node in self.nodes()

    def evict(self, node: str, reason: str) -> str:
        with self._locked():
            current = self.nodes()
            if node in current:
                return f"{node} already in {self.path}"
            self._write([*current, node])
        return f"{node} added to {self.path}"

    def restore(self, node: str, reason: str) -> str:
        with self._locked():
            current = self.nodes()
            if node not in current:
                return f"{node} not in {self.path}"
            self._write([n for n in current if n != node])
        return f"{node} removed from {self.path}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One read-modify-write at a time: drains run each on a thread of their own (a DBE
        storm drains several nodes at once), and two writers that read the same list would
        each drop the other's node, or rename the other's temporary file away."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # per open file: threads and processes alike
            yield

    def _write(self, nodes: list[str]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(f"{n}\n" for n in nodes))
        os.replace(tmp, self.path)  # readers see the old list or the new one, never half
