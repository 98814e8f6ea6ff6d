"""The supervisor reads the coordinator's commands with the protocol's decoder: a command it
cannot read is refused in its ack (never carried out half-read), and a restart it cannot read
fails the job loudly. The coordinator is replaced by a recorder of the acks."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sentinel.config import SupervisorConfig
from sentinel.protocol import JobState, ProtocolError, decode_command
from sentinel.supervisor.launcher import LocalLauncher
from sentinel.supervisor.supervisor import Supervisor


class Recorded(Supervisor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acks: list[tuple[str, bool, dict[str, Any]]] = []

    async def _ack(self, cid: str, ok: bool, detail: dict[str, Any]) -> None:
        self.acks.append((cid, ok, detail))

    async def _post(self, events: list[Any]) -> None:
        pass


def _supervisor(tmp_path: Path) -> Recorded:
    cfg = SupervisorConfig(job_id="j", nodes=2, gpus_per_node=1, spares=0)
    return Recorded(cfg, ["true"], LocalLauncher(tmp_path), "t", tmp_path / "control")


def _refusal(raw: dict[str, Any]) -> ProtocolError:
    try:
        decode_command(raw)
    except ProtocolError as e:
        return e
    raise AssertionError(f"{raw} decoded")


def test_an_unreadable_command_is_refused_once_in_its_ack(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path)
    raw = {"v": 1, "id": "c1", "kind": "no.such", "target": {"job": "j"}, "args": {}}
    for _ in range(2):  # delivered again: refused once
        asyncio.run(sup._unreadable(raw, _refusal(raw)))
    assert [(cid, ok) for cid, ok, _ in sup.acks] == [("c1", False)]
    assert "kind" in sup.acks[0][2]["error"]
    assert sup.job.state == JobState.STARTING and not sup.done.is_set()
    assert not (tmp_path / "control").exists()  # nothing reached the ranks


def test_an_unreadable_restart_fails_the_job(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path)
    plan = {"exclude": ["node-1"], "skip_batches": [[5, 2]]}
    raw = {"v": 1, "id": "c2", "kind": "job.restart", "target": {"job": "j"}, "args": plan}
    asyncio.run(sup._unreadable(raw, _refusal(raw)))
    assert sup.job.state == JobState.FAILED and sup.exit_code == 1 and sup.done.is_set()
    assert [(cid, ok) for cid, ok, _ in sup.acks] == [("c2", False)]
