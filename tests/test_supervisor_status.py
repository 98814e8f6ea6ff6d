"""The supervisor's `job.status` reports: a newly committed checkpoint is reported at once, not
at the next heartbeat (a repair that waits for one acts on that report). The coordinator is
replaced by a recorder of what the supervisor posts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sentinel.config import SupervisorConfig
from sentinel.supervisor.launcher import LocalLauncher
from sentinel.supervisor.supervisor import CHECKPOINT_LOOK_S, Supervisor


class Recorded(Supervisor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.posted: list[tuple[float, list[int]]] = []

    async def _post(self, events: list[Any]) -> None:
        now = asyncio.get_running_loop().time()
        self.posted += [(now, e.payload.checkpoints) for e in events]


def test_a_committed_checkpoint_is_reported_before_the_next_heartbeat(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = SupervisorConfig(job_id="j", nodes=1, spares=0, heartbeat_s=30, checkpoint_dir=ckpt)
    sup = Recorded(cfg, ["true"], LocalLauncher(tmp_path), "t", tmp_path / "control")

    async def commit_then_stop() -> float:
        beat = asyncio.create_task(sup._heartbeat())
        await asyncio.sleep(0.5)
        torn = ckpt / "step-00000010"
        torn.mkdir()  # written, not yet committed: not reported
        await asyncio.sleep(3 * CHECKPOINT_LOOK_S)
        (torn / "COMMITTED").touch()
        committed = asyncio.get_running_loop().time()
        await asyncio.sleep(1.0)
        sup.done.set()
        await beat
        return committed

    committed = asyncio.run(commit_then_stop())
    assert [c for _, c in sup.posted] == [[], [10]], sup.posted
    assert sup.posted[1][0] - committed <= 2 * CHECKPOINT_LOOK_S
