"""The reference trainer as real gloo ranks, with or without a slowed rank, reporting to a
recording agent socket: what the straggler tests and `benchmarks/stragglers.py` both run.

Every run uses the hooks' shipped defaults (nothing but the agent socket is set) and the
demo's tiny model; a `straggler` fault makes its rank's device do `slowdown` times the work
from `at_step` on (`trainer_hooks.reference.slowdown`).

Ranks that the scoring compares (a pipeline stage's ranks, `trainer_hooks.straggler`) share a
core; the stages spread over the cores. They are simulated devices that must be alike but for
the fault, and these VMs' vCPUs are not: each changes speed on its own, by up to 1.75x in spells
of 0.2-1 s (the host's load on the cores beneath it), and a rank's CPU time takes the speed of
the vCPU it ran on. Spread over two vCPUs, clean DP4 peers measured 3-4% apart for minutes and a
20-step window's median ratio varied twice as much as on one core. On one core the peers see
the same spells, which the per-step comparison cancels, as it cancels a node's load on real
GPUs, whose clocks do not follow a neighbour's load."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.hooks_support.gang import fake_agent
from trainer_hooks.reference.launch import GangFailed, launch

MODEL = ["--layers", "2", "--dim", "32", "--heads", "4", "--seq", "16", "--vocab", "128"]
MODEL += ["--corpus-tokens", "32768", "--mbs", "2", "--accum", "2", "--warmup", "2", "--quiet"]


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        """`TPxPPxDP`, e.g. `2x2x2`."""
        tp, pp, dp = (int(x) for x in text.split("x"))
        return cls(tp, pp, dp)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"{self.tp}x{self.pp}x{self.dp}"


@dataclass(frozen=True)
class Named:
    rank: int
    step: int  # the step whose exchange carried the verdict
    slowdown: float


def run(
    layout: Layout, steps: int, fault: str | None = None, timeout: float = 900, pin: bool = True
) -> list[Named]:
    """Train `steps` steps; every `rank.straggler` event, in the order received. `pin=False`
    leaves the ranks where the machine places them."""
    with tempfile.TemporaryDirectory(prefix="sentinel-stragglers-") as name:
        tmp = Path(name)
        args = [*MODEL, "--tp", str(layout.tp), "--pp", str(layout.pp), "--dp", str(layout.dp)]
        args += ["--steps", str(steps), "--checkpoint-every", "0", "--out", str(tmp / "out")]
        args += ["--fault", fault] if fault else []
        with fake_agent(tmp) as agent:
            env = {**os.environ, "SENTINEL_AGENT_SOCKET": str(agent.path)}
            gang = launch(layout.world, args, log_dir=tmp / "logs", env=env, fork=True)
            if pin:
                _peers_share_a_core(layout, [p.pid for p in gang.procs])
            try:
                codes = gang.wait(timeout)
            finally:
                gang.kill()
            if any(codes):
                raise GangFailed(f"exit codes {codes}:\n{gang.tail(0)}")
            time.sleep(0.5)  # the ranks flushed their events on exit; let the reader take them
            return [
                Named(rank, int(p.step), float(p.slowdown))
                for rank, p in agent.payloads("rank.straggler")
                if rank is not None
            ]


def _peers_share_a_core(layout: Layout, pids: list[int]) -> None:
    """Pin every thread of each rank to its pipeline stage's core (ranks are (pp, dp, tp) major
    to minor, as the reference trainer's mesh lays them out)."""
    cores = sorted(os.sched_getaffinity(0))
    for rank, pid in enumerate(pids):
        core = cores[(rank // (layout.dp * layout.tp)) % len(cores)]
        with contextlib.suppress(FileNotFoundError):  # a rank that died: its exit code says
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                    os.sched_setaffinity(int(tid), {core})
