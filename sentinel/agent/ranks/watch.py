"""The hang watchdog from outside the rank: the agent reads each registered rank's beacon.

The hooks' watchdog is a thread of the rank. A rank stopped by the kernel (SIGSTOP, a frozen
cgroup, a debugger) or wedged in a C call that holds the GIL silences it too: such a job sits
with its collectives' watchdogs armed and nothing fires. Every sweep, the agent reads each
registered rank's beacon (sentinel/beacon.py): a rank whose last progress is older than its own
hang timeout plus `margin_s`, that is not paused, and whose watchdog has not reported the stall
itself, is reported hung by the agent (`rank.hang`, observer `agent`) once per stall, with its
process's state from /proc and the share of a core it used while stalled: stopped, or running
on a full core (a C call spinning). The hang playbook runs as for any hang, and takes a rank
seen stopped or spinning for the culprit (coordinator/core/actions/diagnose.py: `silenced`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sentinel.agent.ranks.registry import Watched
from sentinel.beacon import NONE, BeaconState, read_beacon
from sentinel.protocol import Event, RankHangEvent, RankHangPayload, Source

Clock = Callable[[], float]
# How often the beacons are read: a few 48-byte files, so more often than the agent's sweep;
# a hidden hang is reported within its timeout + the margin + this.
EVERY_S = 0.5
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "waiting uninterruptibly",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "a zombie",
}


@dataclass(frozen=True)
class ProcStat:
    state: str  # /proc/PID/stat's state letter
    cpu_s: float  # user + system time so far


def proc_stat(pid: int, proc: Path = Path("/proc")) -> ProcStat | None:
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after the command, which may hold spaces
    ticks = os.sysconf("SC_CLK_TCK")
    return ProcStat(fields[0], (int(fields[11]) + int(fields[12])) / ticks)


@dataclass
class _Stall:
    step: int
    since: float  # when the agent first saw this stall (monotonic)
    cpu_s: float | None  # the process's CPU time then
    reported: bool = False


class OutsideWatchdog:
    def __init__(self, node: str, margin_s: float, clock: Clock = time.monotonic) -> None:
        self.node, self.margin_s, self._clock = node, margin_s, clock
        self._stalls: dict[tuple[str, int, int], _Stall] = {}  # (job, rank, pid)

    def check(self, ranks: Iterable[Watched]) -> list[Event]:
        """One sweep: the `rank.hang` events of the ranks found stalled past their timeout."""
        now, seen = self._clock(), set()
        out: list[Event] = []
        for w in ranks:
            key = (w.reg.job, w.reg.rank, w.peer.pid)
            seen.add(key)
            state = read_beacon(w.beacon, w.peer.uid)
            if state is None or state.paused or state.reported == state.step:
                self._stalls.pop(key, None)
                continue
            stall = self._stalls.get(key)
            if stall is None or stall.step != state.step:
                # First sight of this step: the CPU time from here says whether the process
                # spins or sleeps, so it is judged at a later check, never at this one.
                stat = proc_stat(w.peer.pid)
                self._stalls[key] = _Stall(state.step, now, stat.cpu_s if stat else None)
                continue
            waited = now - state.progress_at
            if stall.reported or waited <= state.timeout_s + self.margin_s:
                continue
            stall.reported = True
            out.append(self._hang(w, state, waited, stall, now))
        for gone in set(self._stalls) - seen:
            del self._stalls[gone]
        return out

    def _hang(
        self, w: Watched, state: BeaconState, waited: float, stall: _Stall, now: float
    ) -> RankHangEvent:
        stat = proc_stat(w.peer.pid)
        span = now - stall.since
        share = None
        if stat is not None and stall.cpu_s is not None and span > 0:
            share = round(max(0.0, stat.cpu_s - stall.cpu_s) / span, 3)
        payload = RankHangPayload(
            step=None if state.step == NONE else state.step,
            waited_s=round(waited, 3),
            timeout_s=state.timeout_s,
            observer="agent",
            process_state=describe(stat),
            cpu_share=share,
        )
        source = Source(node=self.node, rank=w.reg.rank, job=w.reg.job)
        return RankHangEvent(source=source, payload=payload)


def describe(stat: ProcStat | None) -> str:
    """`T (stopped)`, `R (running)`, ...; `gone` when the process has ended."""
    if stat is None:
        return "gone"
    return f"{stat.state} ({STATES.get(stat.state, 'unknown')})"
