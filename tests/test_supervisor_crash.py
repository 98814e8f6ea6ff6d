"""The supervisor reports a rank that died on its own, even when a stop or restart arrives
before its watch loop has seen the death: real rank processes, the coordinator replaced by a
recorder of what the supervisor posts."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from sentinel.config import SupervisorConfig
from sentinel.protocol import CommandKind
from sentinel.supervisor.launcher import LocalLauncher
from sentinel.supervisor.supervisor import Supervisor

# Rank 0 dies at once (exit 3); rank 1 would train for a minute.
TRAINER = [sys.executable, "-c",
           "import os, sys, time; r = int(os.environ['RANK']); sys.exit(3) if r == 0 else "
           "time.sleep(60)"]  # fmt: skip


class Recorded(Supervisor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.posted: list[Any] = []

    async def _post(self, events: list[Any]) -> None:
        self.posted += events


def test_a_rank_dead_before_a_stop_arrives_is_still_reported(tmp_path: Path) -> None:
    cfg = SupervisorConfig(job_id="j", nodes=2, gpus_per_node=1, spares=0)
    sup = Recorded(cfg, TRAINER, LocalLauncher(tmp_path), "t", tmp_path / "control")
    sup._launch()
    assert sup.gang is not None
    sup.gang.procs[0].wait(timeout=30)  # type: ignore[attr-defined]
    # the stop lands before the watch loop's next poll would have seen rank 0's exit
    asyncio.run(sup._execute(CommandKind.JOB_STOP, {}))
    crashes = [e for e in sup.posted if e.kind == "rank.crash"]
    assert [(e.source.rank, e.source.node, e.payload.exit_code) for e in crashes] == [
        (0, "node-0", 3)
    ]
    assert sup.gang is None and sup.job.state == "stopped"
