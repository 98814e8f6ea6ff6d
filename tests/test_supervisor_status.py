"""The supervisor's `job.status` reports: a newly committed checkpoint is reported at once, not
at the next heartbeat (a repair that waits for one acts on that report). The coordinator is
replaced by a recorder of what the supervisor posts. And a job of replicas launches a new
generation only once the lighthouse has forgotten the replicas whose processes ended."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from coord_util import wait_for

from sentinel.config import SupervisorConfig
from sentinel.lighthouse import SETTINGS, Lighthouse
from sentinel.supervisor.launcher import Gang, GangPlan, LocalLauncher
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


class Recording(LocalLauncher):
    """Records when each replica's launch reached it, and starts nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.launched: list[float] = []

    def launch(self, plan: GangPlan) -> Gang:
        self.launched.append(time.monotonic())
        raise OSError("recorded, not started")


def test_replicas_launch_only_once_the_lighthouse_forgets_the_ended_ones(tmp_path: Path) -> None:
    """A replica that was waiting for a quorum when its processes ended stays asked for one
    until its last heartbeat is older than the lighthouse's heartbeat timeout; a new replica
    that asks before then is put in a quorum with it (and heals from a dead peer). A live
    repair's joiner launches only after that timeout since the last processes ended; when every
    replica was ended and the lighthouse shows none of them asking, the next generation
    launches at once."""
    cfg = SupervisorConfig(job_id="j", nodes=2, spares=0, replicas=2)
    launcher = Recording(tmp_path)
    sup = Supervisor(cfg, ["true"], launcher, "t", tmp_path / "control")
    sup.lighthouse = lighthouse = Lighthouse(tmp_path / "lighthouse.log")
    try:
        assert lighthouse.forgets_s == SETTINGS["heartbeat_timeout_ms"] / 1000
        assert lighthouse.asking() == 0
        sup._stopped_at = time.monotonic()
        asyncio.run(sup._launch(only={1}))  # a joiner: the survivors ask at every step
        assert launcher.launched[-1] - sup._stopped_at >= lighthouse.forgets_s
        sup._stopped_at = time.monotonic()
        asyncio.run(sup._launch())  # every replica ended, none asking
        assert launcher.launched[-1] - sup._stopped_at < lighthouse.forgets_s / 2
    finally:
        lighthouse.close()
    assert lighthouse.asking(timeout_s=0.5) is None  # gone: not read as nobody asking


def test_a_replica_that_ended_asking_for_a_quorum_holds_the_launch_until_forgotten(
    tmp_path: Path,
) -> None:
    """The case itself, on a real lighthouse: replica 0 asks for a quorum (which waits for
    replica 1, heartbeating but not asking) and then goes silent, as a process ended while it
    waited. Every replica ended, the next generation still waits until the lighthouse no longer
    counts replica 0's ask."""
    from torchft._torchft import LighthouseClient

    cfg = SupervisorConfig(job_id="j", nodes=2, spares=0, replicas=2)
    launcher = Recording(tmp_path)
    sup = Supervisor(cfg, ["true"], launcher, "t", tmp_path / "control")
    sup.lighthouse = lighthouse = Lighthouse(tmp_path / "lighthouse.log")
    try:
        client = LighthouseClient(lighthouse.address, timedelta(seconds=5))
        client.heartbeat("replica-1:b")

        def ask() -> None:
            with contextlib.suppress(Exception):  # no quorum forms: it times out
                client.quorum("replica-0:a", timedelta(seconds=3), address="a", step=5)

        threading.Thread(target=ask, daemon=True).start()
        wait_for(lambda: lighthouse.asking() == 1, timeout=5, what="replica 0 asking")
        sup._stopped_at = time.monotonic()
        asyncio.run(sup._launch())
        assert lighthouse.asking() == 0
        assert launcher.launched[-1] - sup._stopped_at >= lighthouse.forgets_s / 2
    finally:
        lighthouse.close()
