"""A simulated burn-in fleet on this machine: N nodes x G ranks as local gloo processes.

Each rank gets RANK/WORLD_SIZE/MASTER_* like torchrun would set, plus SENTINEL_NODE, its
simulated node identity. No torch import here: the parent only launches and waits.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sentinel.processes import first_failure, free_port, spawn, stop


def rank_env(
    rank: int, world: int, node: str, local: int, port: int, addr: str = "127.0.0.1"
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(local),
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        SENTINEL_NODE=node,
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore::FutureWarning",
    )
    return env


def spawn_fleet(
    nodes: int, gpus_per_node: int, cmd: Sequence[str], timeout_s: float = 1800.0
) -> int:
    """Run `cmd` once per rank; the first non-zero exit code, else 0.

    If one rank dies the others would wait forever on it, so they are stopped.
    """
    world, port = nodes * gpus_per_node, free_port()
    procs = [
        spawn(cmd, env=rank_env(r, world, f"node-{r // gpus_per_node}", r % gpus_per_node, port))
        for r in range(world)
    ]
    try:
        return first_failure(procs, timeout_s)
    finally:
        stop(procs, 10.0)


def run_sim(nodes: int, gpus_per_node: int, settings_file: Path) -> int:
    cmd = [sys.executable, "-m", "sentinel.burnin.worker", str(settings_file)]
    return spawn_fleet(nodes, gpus_per_node, cmd)
