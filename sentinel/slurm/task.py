"""`python -m sentinel.slurm.task -- TRAINER...`: one task of a Slurm job step becomes one rank.

srun starts `gpus_per_node` tasks on each node of the step; this sets the torchrun variables
from Slurm's and from the gang plan, then execs the trainer. The rank comes from the node's
place in the plan (`SENTINEL_NODES`) and the task's local id, not from Slurm's task id: Slurm
numbers a step's nodes in its own order, and the supervisor must know which node holds a rank
(a crashed rank's node is the one a repeated crash evicts). Kept to the standard library: it
runs before every rank.
"""

from __future__ import annotations

import os
import sys
import time


def rank_env(env: dict[str, str]) -> dict[str, str]:
    node = env["SLURMD_NODENAME"]
    nodes = env["SENTINEL_NODES"].split(",")
    if node not in nodes:
        raise SystemExit(f"sentinel.slurm.task: {node} is not in the gang's nodes {nodes}")
    per_node = int(env["SENTINEL_GPUS_PER_NODE"])
    local = int(env["SLURM_LOCALID"])
    out = {
        "RANK": str(nodes.index(node) * per_node + local),
        "WORLD_SIZE": str(len(nodes) * per_node),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(nodes.index(node)),
        "SENTINEL_NODE": node,
    }
    fr_dir = env.get("SENTINEL_HOOKS_FR_DIR")
    if fr_dir and "{node}" in fr_dir:  # one dump directory per node, never a shared one
        out["SENTINEL_HOOKS_FR_DIR"] = fr_dir.format(node=node)
    template = env.get("SENTINEL_RANK_SOCKET_TEMPLATE")
    if template:  # the foundation's name and the trainer hooks' name for the same socket
        out["SENTINEL_RANK_SOCKET"] = out["SENTINEL_AGENT_SOCKET"] = template.format(node=node)
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m sentinel.slurm.task -- TRAINER_COMMAND...")
    ranks = rank_env(dict(os.environ))
    # when srun's step launch ended on this node: where a restart's time goes (benchmarks)
    print(
        f"sentinel.slurm.task: rank {ranks['RANK']} on {ranks['SENTINEL_NODE']} started at"
        f" {time.time():.3f}",
        file=sys.stderr,
        flush=True,
    )
    os.execvpe(argv[0], argv, {**os.environ, **ranks})


if __name__ == "__main__":
    main(sys.argv[1:])
