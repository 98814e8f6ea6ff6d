"""Slurm: drain a node with `scontrol update NodeName=... State=DRAIN Reason=...`.

A node being returned is validated first, and Slurm runs no job on a drained node. So the node
is held in a maintenance reservation of its own (`sentinel-validate-NODE`, admitting the user
the agents run as) and resumed: no other job can land there, and the agent launches the
validation burn-in as a job step inside it. A pass deletes the reservation (the node is in
service); a failure drains the node again, then deletes it. The reservation has no end: a
coordinator that vanishes mid-validation leaves the node kept out, never returned unvalidated.
"""

from __future__ import annotations

import re
import subprocess
import time

from sentinel.coordinator.core.effects import EvictionBackend, EvictionError, SchedulerNode

_FIELD = {key: re.compile(rf"\b{key}=(\S+)") for key in ("NodeName", "State")}
# The reason runs to the next key (`Key=`) or the line's end; it may hold spaces.
_REASON = re.compile(r"\bReason=(.*?)(?=\s+[A-Za-z]+=|$)")
# The state flags that hold a node out of service: drained or draining, down, failing.
_OUT = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})


def reservation_of(node: str) -> str:
    return f"sentinel-validate-{node}"


class SlurmBackend(EvictionBackend):
    name = "slurm"
    polls_scheduler = True

    def __init__(
        self, scontrol: str = "scontrol", timeout_s: float = 30.0, validation_user: str = "sentinel"
    ) -> None:
        self.scontrol = scontrol
        self.timeout_s = timeout_s
        self.validation_user = validation_user

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [self.scontrol, *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EvictionError(f"{' '.join(argv[:3])}: {e}") from None

    def _scontrol(self, *args: str) -> str:
        """Run scontrol; any way it fails is an EvictionError with scontrol's own message (the
        controller down, the node unknown, no scontrol at all, no answer within the timeout)."""
        done = self._run(*args)
        if done.returncode != 0:
            err = done.stderr.strip() or done.stdout.strip()
            raise EvictionError(
                f"{self.scontrol} {' '.join(args[:2])} exited {done.returncode}: {err}"
            )
        return done.stdout

    def evict(self, node: str, reason: str) -> str:
        started = time.monotonic()
        self._scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        return f"drained {node} through scontrol in {time.monotonic() - started:.3f}s"

    def restore(self, node: str, reason: str) -> str:
        """Resume the node if Slurm still holds it drained, and end its validation's hold."""
        did = [self._resume(node), self._end_hold(node)]
        return "; ".join(d for d in did if d) or f"{node} already in service"

    def hold_for_validation(self, node: str) -> tuple[str, dict[str, str]]:
        name = reservation_of(node)
        if not self._held(node):
            self._scontrol(
                "create",
                "reservation",
                f"ReservationName={name}",
                f"Nodes={node}",
                "StartTime=now",
                "Duration=UNLIMITED",
                f"Users={self.validation_user}",
                "Flags=MAINT,IGNORE_JOBS",
            )
        self._resume(node)
        return f"{node} resumed into reservation {name} for its validation", {"reservation": name}

    def release_validation(self, node: str, reason: str) -> str:
        """Drain first, then end the reservation: the node is never free in between."""
        self.evict(node, reason)
        self._end_hold(node)
        return f"drained {node} again and ended reservation {reservation_of(node)}"

    def _resume(self, node: str) -> str:
        """Resume the node if Slurm holds it drained (resuming an idle node is an error)."""
        if not self.is_evicted(node):
            return ""
        self._scontrol("update", f"NodeName={node}", "State=RESUME")
        return f"resumed {node} through scontrol"

    def _end_hold(self, node: str) -> str:
        """Delete the node's validation reservation, if it has one."""
        if not self._held(node):
            return ""
        self._scontrol("delete", f"ReservationName={reservation_of(node)}")
        return f"ended reservation {reservation_of(node)}"

    def _held(self, node: str) -> bool:
        """Whether the node's validation reservation exists (scontrol says "not found" else)."""
        done = self._run("show", "reservation", reservation_of(node))
        if done.returncode == 0 and f"ReservationName={reservation_of(node)}" in done.stdout:
            return True
        said = (done.stdout + done.stderr).lower()
        if "not found" in said or "invalid" in said or "no reservations" in said:
            return False
        raise EvictionError(f"{self.scontrol} show reservation: {said.strip()[:300]}")

    def scheduler_nodes(self) -> dict[str, SchedulerNode]:
        """`scontrol show node --oneliner`: every node's state and reason, in one call."""
        seen: dict[str, SchedulerNode] = {}
        for line in self._scontrol("show", "node", "--oneliner").splitlines():
            name, state = _FIELD["NodeName"].search(line), _FIELD["State"].search(line)
            if name is None or state is None:
                continue
            reason = _REASON.search(line)
            flags = {f.rstrip("*~#!%$@^-") for f in state.group(1).upper().split("+")}
            seen[name.group(1)] = SchedulerNode(
                state=state.group(1),
                reason=reason.group(1).strip() if reason else "",
                out=bool(flags & _OUT),
            )
        return seen

    def is_evicted(self, node: str) -> bool:
        """`scontrol show node`'s State holds DRAIN (draining or drained) for a drained node."""
        state = re.search(r"\bState=(\S+)", self._scontrol("show", "node", node))
        return state is not None and "DRAIN" in state.group(1).upper()
