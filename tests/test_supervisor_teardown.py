"""Hang to hard teardown on real processes: a gloo gang whose ranks do not end on SIGTERM is
still gone, every process of it, within 30 s, and the teardown says so.

Rank 0 blocks in an all_reduce that rank 1 never joins, with a Python SIGTERM handler (it never
runs: the main thread is inside gloo); rank 1 ignores SIGTERM and started a helper in a session
of its own that ignores it too (a process-group signal misses it)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from coord_util import ROOT, wait_for

from sentinel.processes import alive, free_rendezvous_port, proc_stat
from sentinel.supervisor.launcher import Gang, GangPlan, LocalLauncher
from sentinel.supervisor.replicas import ReplicaGang

GRACE_S = 3.0


def _lines(logs: Path, word: str) -> list[list[str]]:
    return [
        line.split()
        for log in sorted(logs.glob("g0-rank*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith(word + " ")
    ]


def test_a_hung_gang_that_ignores_sigterm_is_gone_within_30_s(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    plan = GangPlan(
        argv=[sys.executable, str(ROOT / "tests/helpers/stacks_rank.py")],
        nodes=["node-0", "node-1"],
        gpus_per_node=1,
        generation=0,
        master_port=free_rendezvous_port(),
        env={
            "HANG_RANK": "0",
            "HANDLE_TERM": "0",
            "IGNORE_TERM": "1",
            "ESCAPEE_RANK": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "SENTINEL_HOOKS_ENABLED": "0",
        },
    )
    gang = LocalLauncher(logs).launch(plan)
    try:
        wait_for(lambda: len(_lines(logs, "ready")) == 2, 90, "both ranks parked")
        escapee = int(_lines(logs, "escapee")[0][1])
        time.sleep(0.5)  # rank 0 is inside the all_reduce by now
        ranks = [int(p.pid) for p in gang.procs]  # type: ignore[attr-defined]
        started = {pid: st[2] for pid in [*ranks, escapee] if (st := proc_stat(pid)) is not None}
        assert len(started) == 3

        result = gang.stop(grace_s=GRACE_S)

        assert result.verified and result.survivors == []
        assert GRACE_S <= result.seconds < 30.0  # nobody ended on SIGTERM; SIGKILL did it
        assert set(result.killed) >= {*ranks, escapee}
        assert not any(alive(pid, start) for pid, start in started.items())
        assert result.codes == [-9, -9]
        assert "SIGTERM handled" not in (logs / "g0-rank0.log").read_text()
    finally:
        for pid in _lines(logs, "escapee"):
            if proc_stat(int(pid[1])) is not None:
                os.kill(int(pid[1]), 9)
        gang.stop(grace_s=1.0)


def test_a_replica_rank_that_died_before_its_live_stop_is_still_reported(tmp_path: Path) -> None:
    """A live repair stops one replica while its rank is crashing: the stop hands back that
    rank's end, as the job's rank (replica 1's rank 1 is the job's rank 3), and nothing of the
    replica that keeps running."""

    def gang(replica: int, crash_rank: int | None) -> Gang:
        code = "import os, sys, time; r = int(os.environ['RANK'])\n" + (
            f"sys.exit(3) if r == {crash_rank} else time.sleep(60)"
        )
        plan = GangPlan(
            argv=[sys.executable, "-c", code],
            nodes=[f"node-{2 * replica}", f"node-{2 * replica + 1}"],
            gpus_per_node=1,
            generation=0,
            label=f"replica{replica}",
        )
        return LocalLauncher(tmp_path).launch(plan)

    replicas = ReplicaGang({0: gang(0, None), 1: gang(1, 1)}, ranks_per_replica=2)
    try:
        struck = replicas.gangs[1]
        wait_for(lambda: struck.running() == 1, 30, "replica 1's rank 1 ended")

        result, ended = replicas.stop_replica(1, grace_s=1.0)

        assert [(e.rank, e.node, e.returncode) for e in ended] == [(3, "node-3", 3)]
        assert result.verified and sorted(replicas.gangs) == [0]
        assert replicas.poll() == [] and replicas.running() == 2
    finally:
        replicas.stop(grace_s=1.0)
