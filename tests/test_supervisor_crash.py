"""The supervisor reports a rank that died on its own, even when a stop or restart arrives
before its watch loop has seen the death: real rank processes, the coordinator replaced by a
recorder of what the supervisor posts."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sentinel.config import SupervisorConfig
from sentinel.protocol import Command, CommandKind, Source
from sentinel.supervisor.launcher import LocalLauncher
from sentinel.supervisor.supervisor import Supervisor

# Rank 0 dies at once (exit 3); rank 1 would train for a minute.
TRAINER = [
    sys.executable,
    "-c",
    "import os, sys, time; r = int(os.environ['RANK']); sys.exit(3) if r == 0 else time.sleep(60)",
]


def _command(kind: CommandKind) -> Command:
    return Command(kind=kind, target=Source(job="j"))


class Recorded(Supervisor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.posted: list[Any] = []

    async def _post(self, events: list[Any]) -> None:
        self.posted += events


def test_a_rank_dead_before_a_stop_arrives_is_still_reported(tmp_path: Path) -> None:
    cfg = SupervisorConfig(job_id="j", nodes=2, gpus_per_node=1, spares=0)
    sup = Recorded(cfg, TRAINER, LocalLauncher(tmp_path), "t", tmp_path / "control")
    asyncio.run(sup._launch())
    assert sup.gang is not None
    sup.gang.procs[0].wait(timeout=30)  # type: ignore[attr-defined]
    # the stop lands before the watch loop's next poll would have seen rank 0's exit
    asyncio.run(sup._execute(_command(CommandKind.JOB_STOP)))
    crashes = [e for e in sup.posted if e.kind == "rank.crash"]
    assert [(e.source.rank, e.source.node, e.payload.exit_code) for e in crashes] == [
        (0, "node-0", 3)
    ]
    assert sup.gang is None and sup.job.state == "stopped"


class _BeforeStop(LocalLauncher):
    """Runs `before(gang)` as the first gang's stop begins, before it signals any rank."""

    def __init__(self, log_dir: Path, before: Callable[[Any], object]) -> None:
        super().__init__(log_dir)
        self.before = before

    def launch(self, plan: Any) -> Any:
        gang = super().launch(plan)
        if plan.generation == 0:
            stop = gang.stop

            def stop_after_before(grace_s: float = 5.0, keep: frozenset[str] = frozenset()) -> Any:
                self.before(gang)
                return stop(grace_s, keep)

            gang.stop = stop_after_before  # type: ignore[method-assign]
        return gang


def test_a_rank_that_dies_as_the_stop_begins_is_still_reported(tmp_path: Path) -> None:
    late = [
        sys.executable,
        "-c",
        "import os, sys, time; r = int(os.environ['RANK']); time.sleep(1); "
        "sys.exit(3) if r == 0 else time.sleep(60)",
    ]
    cfg = SupervisorConfig(job_id="j", nodes=2, gpus_per_node=1, spares=0)
    # rank 0 dies after the supervisor's last poll but before the stop's first signal
    launcher = _BeforeStop(tmp_path, lambda gang: gang.procs[0].wait(timeout=30))
    sup = Recorded(cfg, late, launcher, "t", tmp_path / "control")
    asyncio.run(sup._launch())
    asyncio.run(sup._execute(_command(CommandKind.JOB_STOP)))
    crashes = [e for e in sup.posted if e.kind == "rank.crash"]
    # rank 0's exit is its own; rank 1 ended by the stop's SIGTERM and is no crash
    assert [(e.source.rank, e.payload.exit_code) for e in crashes] == [(0, 3)]
    assert sup.job.state == "stopped"


def test_a_restart_during_the_watchs_stop_keeps_the_next_gang_running(tmp_path: Path) -> None:
    first_dies = [
        sys.executable,
        "-c",
        "import os, sys, time; first = os.environ['SENTINEL_GENERATION'] == '0'; "
        "sys.exit(3) if first and os.environ['RANK'] == '0' else time.sleep(60)",
    ]
    cfg = SupervisorConfig(job_id="j", nodes=2, gpus_per_node=1, spares=0)
    # the first gang's stop takes a second (a rank slow to end): long enough for a restart
    # command to arrive while the watch loop is stopping a gang with a dead rank
    stopping = threading.Event()
    launcher = _BeforeStop(tmp_path, lambda _: (stopping.set(), time.sleep(1.0)))
    sup = Recorded(cfg, first_dies, launcher, "t", tmp_path / "control")

    async def crash_then_restart() -> None:
        await sup._launch()
        watch = asyncio.create_task(sup._watch())
        await asyncio.to_thread(stopping.wait, 30)  # the watch loop saw rank 0 die
        await sup._execute(_command(CommandKind.JOB_RESTART))
        while not any(e.kind == "rank.crash" for e in sup.posted):
            await asyncio.sleep(0.05)
        sup.done.set()
        await watch

    try:
        asyncio.run(crash_then_restart())
        crashes = [e for e in sup.posted if e.kind == "rank.crash"]
        assert [(e.source.rank, e.payload.generation) for e in crashes] == [(0, 0)]
        assert sup.job.generation == 1 and sup.job.state == "running"
    finally:
        if sup.gang is not None:
            sup.gang.stop(1.0)
