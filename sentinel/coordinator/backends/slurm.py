"""Slurm: drain a node with `scontrol update NodeName=... State=DRAIN Reason=...`."""

from __future__ import annotations

import re
import subprocess
import time

from sentinel.coordinator.core.effects import EvictionBackend, EvictionError


class SlurmBackend(EvictionBackend):
    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", timeout_s: float = 30.0) -> None:
        self.scontrol = scontrol
        self.timeout_s = timeout_s

    def _scontrol(self, *args: str) -> str:
        """Run scontrol; any way it fails is an EvictionError with scontrol's own message (the
        controller down, the node unknown, no scontrol at all, no answer within the timeout)."""
        argv = [self.scontrol, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EvictionError(f"{' '.join(argv[:3])}: {e}") from None
        if done.returncode != 0:
            err = done.stderr.strip() or done.stdout.strip()
            raise EvictionError(f"{' '.join(argv[:3])} exited {done.returncode}: {err}")
        return done.stdout

    def evict(self, node: str, reason: str) -> str:
        started = time.monotonic()
        self._scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        return f"drained {node} through scontrol in {time.monotonic() - started:.3f}s"

    def restore(self, node: str, reason: str) -> str:
        self._scontrol("update", f"NodeName={node}", "State=RESUME")
        return f"resumed {node} through scontrol"

    def is_evicted(self, node: str) -> bool:
        """`scontrol show node`'s State holds DRAIN (draining or drained) for a drained node."""
        state = re.search(r"\bState=(\S+)", self._scontrol("show", "node", node))
        return state is not None and "DRAIN" in state.group(1).upper()
