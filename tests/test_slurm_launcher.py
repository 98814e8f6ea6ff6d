"""The Slurm launcher: a generation is a job step of a kept allocation, ranks meet over the
cluster network, a rank's exit is attributed to its node; restarts are new steps."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_support import require_cluster

from sentinel.lab.slurm.cluster import SlurmCluster
from sentinel.slurm.allocation import Allocation
from sentinel.slurm.task import rank_env
from sentinel.supervisor.launcher import Gang, GangPlan, RankExit
from sentinel.supervisor.slurm_launcher import SlurmLauncher, parse_task_exit

RANK_SCRIPT = Path(__file__).parent / "helpers" / "gloo_rank.py"


def test_srun_error_lines_become_rank_exits() -> None:
    assert parse_task_exit("srun: error: node-1: task 3: Exited with exit code 3") == (
        "node-1",
        [3],
        3,
    )
    assert parse_task_exit("srun: error: spare-0: tasks 0-1,4: Killed") == (
        "spare-0",
        [0, 1, 4],
        -9,
    )
    assert parse_task_exit("srun: error: node-0: task 0: Segmentation fault")[2] == -11  # type: ignore[index]
    assert parse_task_exit("srun: Job step aborted: Waiting up to 32 seconds") is None


def test_a_task_takes_its_rank_from_its_node_place_in_the_plan() -> None:
    env = {
        "SLURMD_NODENAME": "spare-0",
        "SENTINEL_NODES": "node-0,spare-0,node-2",
        "SENTINEL_GPUS_PER_NODE": "2",
        "SLURM_LOCALID": "1",
        "SENTINEL_RANK_SOCKET_TEMPLATE": "/run/sentinel/{node}.sock",
    }
    out = rank_env(env)
    assert (out["RANK"], out["WORLD_SIZE"], out["LOCAL_RANK"]) == ("3", "6", "1")
    assert out["SENTINEL_RANK_SOCKET"] == "/run/sentinel/spare-0.sock"
    with pytest.raises(SystemExit, match="node-9 is not in the gang"):
        rank_env({**env, "SLURMD_NODENAME": "node-9"})


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    require_cluster()
    with SlurmCluster(["node-0", "node-1", "spare-0"]) as c:
        monkeypatch.setenv("SLURM_CONF", str(c.conf))
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", c.iface)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        yield c


def _finish(gang: Gang, timeout_s: float = 90.0) -> list[RankExit]:
    exits: list[RankExit] = []
    deadline = time.monotonic() + timeout_s
    while gang.running() and time.monotonic() < deadline:
        exits += gang.poll()
        time.sleep(0.1)
    exits += gang.poll()
    assert not gang.running(), "the step did not end"
    return sorted(exits, key=lambda e: e.rank)


def _lines(log_dir: Path, generation: int) -> dict[int, list[str]]:
    out = {}
    for f in log_dir.glob(f"g{generation}-*.log"):
        for line in f.read_text().splitlines():
            fields = line.split()
            if len(fields) == 5 and fields[0].isdigit():
                out[int(fields[0])] = fields[1:]
    return out


@pytest.mark.slow
@pytest.mark.root
def test_generations_are_steps_of_one_allocation(cluster: SlurmCluster, tmp_path: Path) -> None:
    alloc = Allocation.request(3, "sentinel-test")
    try:
        launcher = SlurmLauncher(alloc, tmp_path / "logs")
        assert launcher.node_names(3) == ["node-0", "node-1", "spare-0"]
        argv = [sys.executable, str(RANK_SCRIPT)]
        plan = GangPlan(argv, ["node-0", "node-1"], 2, generation=0, master_port=29611)
        exits = _finish(launcher.launch(plan))
        assert [(e.rank, e.node, e.returncode) for e in exits] == [
            (0, "node-0", 0),
            (1, "node-0", 0),
            (2, "node-1", 0),
            (3, "node-1", 0),
        ]
        lines = _lines(tmp_path / "logs", 0)
        assert {r: v[:2] for r, v in lines.items()} == {
            0: ["node-0", "node-0"],
            1: ["node-0", "node-0"],
            2: ["node-1", "node-1"],
            3: ["node-1", "node-1"],
        }
        assert all(v[2] == cluster.host("node-0").addr and v[3] == "6" for v in lines.values())

        # node-0 evicted: the spare takes its place; rank 1 (now on spare-0) crashes
        os.environ["CRASH_RANK"] = "1"
        plan = GangPlan(argv, ["spare-0", "node-1"], 2, generation=1, master_port=29612)
        exits = _finish(launcher.launch(plan))
        assert [(e.rank, e.node, e.returncode) for e in exits] == [
            (0, "spare-0", 0),
            (1, "spare-0", 3),
            (2, "node-1", 0),
            (3, "node-1", 0),
        ]
        lines = _lines(tmp_path / "logs", 1)
        assert lines[0][1] == "spare-0" and lines[0][2] == cluster.host("spare-0").addr
        assert lines[2][1] == "node-1"
        assert (
            cluster.run(["squeue", "-h", "-j", alloc.job_id, "-o", "%T"]).stdout.strip()
            == "RUNNING"
        )
    finally:
        os.environ.pop("CRASH_RANK", None)
        alloc.release()


@pytest.mark.slow
@pytest.mark.root
def test_stop_ends_a_hung_step(cluster: SlurmCluster, tmp_path: Path) -> None:
    alloc = Allocation.request(2, "sentinel-hang")
    try:
        launcher = SlurmLauncher(alloc, tmp_path / "logs")
        plan = GangPlan(["sleep", "600"], ["node-0", "node-1"], 1, generation=0)
        gang = launcher.launch(plan)
        time.sleep(1.0)
        assert gang.running() == 2
        started = time.monotonic()
        gang.stop(grace_s=2.0)
        assert time.monotonic() - started < 15 and gang.running() == 0
        assert "sentinel-g0" not in cluster.run(["squeue", "-h", "--steps", "-o", "%j"]).stdout
    finally:
        alloc.release()
