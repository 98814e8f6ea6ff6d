"""A Slurm allocation the supervisor runs its job steps in: the one it was started inside
(`sbatch`/`salloc`: SLURM_JOB_ID), or one it asks for and gives back when it ends."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries Slurm's own words."""


def slurm(argv: list[str], timeout: float = 60.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{argv[0]}: {e}") from None
    if done.returncode != 0:
        raise SlurmError(f"{' '.join(argv[:3])} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed node list (`node-[0-3],spare-0`) as names, in Slurm's order."""
    return slurm(["scontrol", "show", "hostnames", nodelist]).split()


def node_addr(node: str) -> str:
    """The address Slurm reaches the node at (its NodeAddr): where rank 0's store listens."""
    out = slurm(["scontrol", "show", "node", node, "--oneliner"])
    m = re.search(r"\bNodeAddr=(\S+)", out)
    if m is None:
        raise SlurmError(f"scontrol show node {node}: no NodeAddr in {out.strip()[:200]}")
    return m.group(1)


@dataclass
class Allocation:
    job_id: str
    nodes: list[str]
    owned: bool = False  # asked for here: released by `release()`
    addrs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def current(cls) -> Allocation | None:
        """The allocation this process runs in (under sbatch or salloc), if any."""
        job = os.environ.get("SLURM_JOB_ID")
        nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
        if not job or not nodelist:
            return None
        return cls(job, hostnames(nodelist))

    @classmethod
    def request(cls, count: int, name: str, timeout_s: float = 300.0) -> Allocation:
        """`salloc --no-shell`: an allocation of `count` nodes, held until `release()`."""
        argv = [
            "salloc",
            "--no-shell",
            f"--nodes={count}",
            f"--job-name={name}",
            f"--immediate={int(timeout_s)}",
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"salloc: {e}") from None
        m = re.search(r"Granted job allocation (\d+)", done.stderr)
        if done.returncode != 0 or m is None:
            raise SlurmError(f"salloc of {count} nodes failed: {done.stderr.strip()[-300:]}")
        job = m.group(1)
        out = slurm(["squeue", "-h", "-j", job, "-o", "%N"])
        return cls(job, hostnames(out.strip()), owned=True)

    def addr(self, node: str) -> str:
        if node not in self.addrs:
            self.addrs[node] = node_addr(node)
        return self.addrs[node]

    def release(self) -> None:
        if self.owned:
            subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30)
            self.owned = False
