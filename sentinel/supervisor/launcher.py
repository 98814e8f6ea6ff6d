"""Launchers: start a training gang and watch its ranks.

`LocalLauncher` runs every rank as a local process with a torchrun-style environment (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus its simulated node
identity `SENTINEL_NODE`. On a real fleet the same supervisor runs each generation as a Slurm
job step (`sentinel.supervisor.slurm_launcher`), which sets the same variables on every node;
only the launcher differs.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.processes import Teardown, spawn, teardown
from sentinel.protocol import Recovery


@dataclass(frozen=True)
class GangPlan:
    argv: list[str]
    nodes: list[str]
    gpus_per_node: int
    generation: int
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    env: dict[str, str] = field(default_factory=dict)
    rank_socket_template: str | None = None  # "{node}" is replaced by the rank's node
    spares: list[str] = field(default_factory=list)  # hot spares: warm launchers keep them ready
    label: str = ""  # names its ranks' logs apart from another gang's of the same generation

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def node_of_rank(self, rank: int) -> str:
        return self.nodes[rank // self.gpus_per_node]

    def log_name(self, rank: int) -> str:
        label = f"-{self.label}" if self.label else ""
        return f"g{self.generation}{label}-rank{rank}.log"

    def with_master(self, addr: str) -> GangPlan:
        return dataclasses.replace(self, master_addr=addr)

    def rank_env(self, rank: int, inherited: Mapping[str, str]) -> dict[str, str]:
        """The job's environment and torchrun's variables for `rank`, with its node's identity
        and its node agent's socket; a per-node path in the `inherited` environment (the flight
        recorder's dump directory with `{node}` in it) made the node's own."""
        node = self.node_of_rank(rank)
        env = {
            **self.env,
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(rank % self.gpus_per_node),
            "LOCAL_WORLD_SIZE": str(self.gpus_per_node),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "SENTINEL_NODE": node,
            "SENTINEL_GENERATION": str(self.generation),
        }
        if self.rank_socket_template:
            sock = self.rank_socket_template.format(node=node)
            # the foundation's name and the trainer hooks' name for the same socket
            env["SENTINEL_RANK_SOCKET"] = env["SENTINEL_AGENT_SOCKET"] = sock
        fr_dir = inherited.get("SENTINEL_HOOKS_FR_DIR", "")
        if per_node(fr_dir):  # one dump directory per node, never a shared one
            env["SENTINEL_HOOKS_FR_DIR"] = fr_dir.format(node=node)
        return env


def per_node(path: str) -> bool:
    """Whether `path` is a template each node resolves to its own (`{node}` in it): it exists
    only there, once resolved (`GangPlan.rank_env`)."""
    return "{node}" in path


@dataclass(frozen=True)
class RankExit:
    rank: int
    node: str
    returncode: int
    # An error caused by another rank's end (a collective failing on a dead peer), not a crash.
    collateral: bool = False
    why: str | None = None  # what the launcher knows of the end (a warm rank's error)

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None


class GangStartError(RuntimeError):
    """A generation that could not start: `ranks` never ran (their node's processes did not
    come up). Nothing of it was started: no rank is left half-joined."""

    def __init__(self, message: str, ranks: list[RankExit]) -> None:
        super().__init__(message)
        self.ranks = ranks


class Gang(ABC):
    @abstractmethod
    def poll(self) -> list[RankExit]:
        """Ranks that ended since the last poll."""

    @abstractmethod
    def running(self) -> int:
        """How many ranks are still alive."""

    @abstractmethod
    def stop(self, grace_s: float = 5.0, keep: frozenset[str] = frozenset()) -> Teardown:
        """End the generation, bounded: SIGTERM, one grace period, SIGKILL to what is left; then
        verify that no rank survived (`Teardown.survivors`). A rank seen to have ended on its
        own before the stop signalled it, and not polled yet, is left for the next `poll`.
        `keep`: nodes whose rank processes may outlive the generation, where the launcher keeps
        processes warm (`sentinel.supervisor.warm`); the others end every rank process."""


class Launcher(ABC):
    @abstractmethod
    def launch(self, plan: GangPlan) -> Gang: ...

    def node_names(self, count: int) -> list[str] | None:
        """The names of the first `count` nodes it launches on (gang, then spares), where the
        launcher decides them (a Slurm allocation); None: the simulated `node-K`/`spare-K`."""
        return None

    @property
    def paths(self) -> frozenset[Recovery]:
        """The repair paths this launcher can take: new processes for every rank."""
        return frozenset({Recovery.RESTART})

    @property
    def advertise(self) -> str:
        """The address this host has towards the job's nodes (where they reach a lighthouse
        the supervisor runs)."""
        return "127.0.0.1"

    def release(self, node: str) -> None:  # noqa: B027 - most launchers keep nothing on a node
        """The job no longer uses `node`: end what the launcher keeps there."""

    def close(self) -> None:  # noqa: B027 - most launchers keep nothing between generations
        """End whatever the launcher keeps between generations (warm processes)."""


class LocalGang(Gang):
    def __init__(self, plan: GangPlan, procs: list[subprocess.Popen[bytes]]) -> None:
        self.plan = plan
        self.procs = procs
        self._reported: set[int] = set()

    def poll(self) -> list[RankExit]:
        out = []
        for rank, proc in enumerate(self.procs):
            rc = proc.poll()
            if rc is not None and rank not in self._reported:
                self._reported.add(rank)
                out.append(RankExit(rank, self.plan.node_of_rank(rank), rc))
        return out

    def running(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def stop(self, grace_s: float = 5.0, keep: frozenset[str] = frozenset()) -> Teardown:
        """Each rank leads a process group of its own: the group is signalled, and so is every
        process below a rank in the tree (a helper that left the group), then checked gone."""
        result = teardown(self.procs, grace_s, group=True)
        self._reported.update(set(range(len(self.procs))) - set(result.ended_before))
        return result


class LocalLauncher(Launcher):
    def __init__(self, log_dir: Path | None = None) -> None:
        self.log_dir = log_dir

    def launch(self, plan: GangPlan) -> Gang:
        procs = []
        for rank in range(plan.world_size):
            env = {**os.environ, **plan.rank_env(rank, os.environ)}
            log = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log = self.log_dir / plan.log_name(rank)
            procs.append(spawn(plan.argv, env=env, log=log, append=False, new_session=True))
        return LocalGang(plan, procs)
