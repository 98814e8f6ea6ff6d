"""The drill on a real Slurm cluster (`sentinel demo --fleet slurm`).

The cluster is started for the scenario's size (nodes plus spares, one namespace each) and torn
down afterwards. The coordinator listens on the cluster network; each node's agent (`--sim`
GPUs) runs inside its node's namespace and reaches it over the bridge with its own node token;
`sentinel run --launcher slurm` asks Slurm for an allocation of every node and runs each
generation of the reference trainer as a job step, its ranks meeting over gloo on `eth0`.
Evictions drain the node in Slurm (`scontrol`), with the incident's id in the reason.
"""

from __future__ import annotations

import dataclasses
import getpass
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sentinel.coordinator.core import scheduler
from sentinel.lab.demo.observe import Observer
from sentinel.lab.demo.procs import SENTINEL, CoordinatorProcess
from sentinel.lab.demo.run import AGENT_INTERVAL_S, BURNIN_PHASES, Demo
from sentinel.lab.sim.cluster import ClusterFleet, node_fr_dir
from sentinel.lab.sim.fleet import SimFleet
from sentinel.lab.slurm.cluster import NodeState, SlurmCluster
from sentinel.processes import free_rendezvous_port

# The simulated cluster network's line rate: every gang node's link is held to it, so a
# degraded link's `factor` is a fraction of a known speed (veth alone runs as fast as the CPUs).
LINE_RATE_MBIT = 1000.0
SLURM_WARM_RESUME_S = 10.0


class SlurmDemo(Demo):
    # the cluster while `train` runs; the nodes' Slurm states as it was torn down
    cluster: SlurmCluster | None = None
    final_states: Mapping[str, NodeState] = MappingProxyType({})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Ranks meet over a cluster network and reach their agents through it: a warm or live
        # repair's target is 10 s here (5 s on the local fleet).
        self.timing = dataclasses.replace(self.timing, warm_resume_s=SLURM_WARM_RESUME_S)

    def coordinator(self) -> CoordinatorProcess:
        assert self.cluster is not None
        env = {
            "SLURM_CONF": str(self.cluster.conf),
            "SENTINEL_COORDINATOR__EVICTION_BACKEND": "slurm",
            # the agents run as this user: their validation reservations admit it
            "SENTINEL_COORDINATOR__SLURM_VALIDATION_USER": getpass.getuser(),
        }
        return CoordinatorProcess(
            self.out / "coordinator",
            self.out / "coordinator.log",
            host=self.cluster.controller_addr,
            env=env,
        )

    def fleet(self, names: list[str]) -> SimFleet:
        assert self.cluster is not None
        return ClusterFleet(
            self.cluster,
            self.out / "fleet",
            names,
            self.scenario.fleet.gpus_per_node,
            AGENT_INTERVAL_S,
        )

    def fleet_env(self) -> dict[str, str]:
        assert self.cluster is not None
        return {
            "SLURM_CONF": str(self.cluster.conf),
            "GLOO_SOCKET_IFNAME": self.cluster.iface,
            "OMP_NUM_THREADS": "1",
            # dumps stay on their node; the agents carry them to the coordinator
            "SENTINEL_HOOKS_FR_DIR": str(node_fr_dir(self.out, "{node}")),
            "SENTINEL_SUPERVISOR__FR_FROM_COORDINATOR": "true",
        }

    def burnin(self) -> Path | None:
        for f in self.scenario.faults:
            if f.kind == "link_degraded":
                self.shape_links(f.node, f.factor)
        return super().burnin()

    def shape_links(self, slow: str, factor: float) -> None:
        """The cluster network runs at LINE_RATE_MBIT on every gang node's link (a token
        bucket on both ends of its veth pair), `slow`'s at `factor` of it: a degraded link the
        burn-in must find by measuring, across namespaces."""
        assert self.cluster is not None
        for node in self.scenario.fleet.node_names():
            rate = LINE_RATE_MBIT * (factor if node == slow else 1.0)
            tbf = ["root", "tbf", "rate", f"{rate:g}mbit", "burst", "512kb", "latency", "50ms"]
            host = self.cluster.host(node)
            for argv in (
                ["tc", "qdisc", "replace", "dev", host.veth, *tbf],
                [*host.enter(), "tc", "qdisc", "replace", "dev", self.cluster.iface, *tbf],
            ):
                done = subprocess.run(argv, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")

    def burnin_command(
        self, spec: Path, outputs: list[str]
    ) -> tuple[list[str], dict[str, str] | None]:
        """The real burn-in as a Slurm job step over the gang's nodes, one task per GPU, its
        ranks meeting over gloo on the cluster network (no simulated link fault in it)."""
        assert self.cluster is not None
        fleet = self.scenario.fleet
        nodes = fleet.node_names()
        srun = [
            "srun",
            f"--nodes={len(nodes)}",
            f"--ntasks-per-node={fleet.gpus_per_node}",
            f"--ntasks={len(nodes) * fleet.gpus_per_node}",
            "--distribution=block",
            f"--nodelist={','.join(nodes)}",
            "--job-name=sentinel-burnin",
            "--export=ALL",
            sys.executable,
            "-m",
            "sentinel.slurm.task",
            "--",
            *SENTINEL,
            "burnin",
            "--quick",
            "--phases",
            BURNIN_PHASES,
            *outputs,
        ]
        env = {
            **self.cluster.env(),
            "SENTINEL_NODES": ",".join(nodes),
            "SENTINEL_GPUS_PER_NODE": str(fleet.gpus_per_node),
            "MASTER_ADDR": self.cluster.host(nodes[0]).addr,
            "MASTER_PORT": str(free_rendezvous_port()),
            "GLOO_SOCKET_IFNAME": self.cluster.iface,
            "OMP_NUM_THREADS": "1",
        }
        return srun, env

    def checkpoint_tiers(self) -> list[str]:
        """Each node writes its part to its own fast tier; the shared durable tier gets the
        whole checkpoint in the background, and restarts resume from it."""
        return [
            "--ckpt-dir",
            str(self.out / "nodes" / "{node}" / "ckpt"),
            "--durable-dir",
            str(self.out / "ckpt"),
        ]

    def supervisor_argv(self, coord_url: str, job_token: Path, exclude: Path | None) -> list[str]:
        argv = super().supervisor_argv(coord_url, job_token, exclude)
        return [argv[0], "--launcher", "slurm", *argv[1:]]

    def train(self, timeout_s: float, stall_s: float) -> tuple[Observer, Any]:
        fleet = self.scenario.fleet
        names = fleet.node_names() + fleet.spare_names()
        cluster = SlurmCluster(names, cpus=max(2, fleet.gpus_per_node))
        with cluster:
            self.cluster = cluster
            self.note(
                "info",
                None,
                f"Slurm cluster up: {', '.join(names)} on "
                f"{cluster.bridge.name} ({cluster.controller_addr}/24)",
            )
            try:
                return super().train(timeout_s, stall_s)
            finally:
                self.final_states = cluster.node_states()
                self.cluster = None


def drained_by_incident(states: Mapping[str, NodeState]) -> dict[int, str]:
    """Which node each incident drained, from the reasons Slurm holds."""
    out = {}
    for node, st in states.items():
        incident = scheduler.incident_of(st.reason)
        if incident is not None and st.state in {"drained", "draining"}:
            out[incident] = node
    return out


def add_slurm_facts(result: dict[str, Any], states: Mapping[str, NodeState]) -> dict[str, Any]:
    """The demo's result plus `fleet: "slurm"`, per fault the node drained in Slurm for its
    incident (`drained_node`, None when the repair drained nothing), and `slurm_nodes`."""
    drained = drained_by_incident(states)
    for fault in result.get("faults", []):
        inc = fault.get("incident")
        fault["drained_node"] = drained.get(int(inc)) if inc is not None else None
    result["fleet"] = "slurm"
    result["slurm_nodes"] = {n: {"state": s.state, "reason": s.reason} for n, s in states.items()}
    return result
