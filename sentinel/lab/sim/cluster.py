"""The simulated fleet on a real Slurm cluster: each node's agent (simulated GPUs) runs inside
its node's network namespace and listens on its node's address on the cluster network."""

from __future__ import annotations

from pathlib import Path

from sentinel.lab.sim.fleet import AgentProcess, SimFleet
from sentinel.lab.slurm.cluster import SlurmCluster


class ClusterFleet(SimFleet):
    """Simulated-GPU agents, each inside its Slurm node's namespace, on its node's address."""

    def __init__(
        self, cluster: SlurmCluster, workdir: Path, names: list[str], gpus: int, interval_s: float
    ) -> None:
        super().__init__(workdir, names, gpus, interval_s)
        self.cluster = cluster
        for name, agent in self.agents.items():
            agent.host = cluster.host(name).addr

    def launch(self, a: AgentProcess) -> list[str]:
        return self.cluster.on_node(a.node_id, self.command(a))

    def agent_env(self, a: AgentProcess) -> dict[str, str]:
        node = self.workdir.parent / "nodes" / a.node_id
        return {
            "SENTINEL_AGENT__FR_DIR": str(node_fr_dir(self.workdir.parent, a.node_id)),
            # a returned node is validated as a Slurm job step in its reservation
            "SENTINEL_AGENT__VALIDATION__LAUNCHER": "slurm",
            "SENTINEL_AGENT__VALIDATION__WORKDIR": str(node / "validate"),
            "SLURM_CONF": str(self.cluster.conf),
        }


def node_fr_dir(out: Path, node: str) -> Path:
    """A node's own flight-recorder directory: nothing reads it but that node's agent."""
    return out / "nodes" / node / "fr"
