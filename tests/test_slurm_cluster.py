"""The real Slurm cluster the drills start: up, one slurmd per namespace, torn down whole."""

from __future__ import annotations

import subprocess

import pytest
from slurm_support import require_cluster

from sentinel.lab.slurm.cluster import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.root]


def _leftovers(c: SlurmCluster) -> list[str]:
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    out = [f"netns {h.netns}" for h in c.bridge.hosts if h.netns in netns]
    out += [f"link {c.bridge.name}"] if f" {c.bridge.name}:" in links else []
    out += [f"dir {c.dir}"] if c.dir.exists() else []
    return out


def test_cluster_runs_a_step_per_node_and_leaves_nothing() -> None:
    require_cluster()
    names = ["node-0", "node-1", "spare-0"]
    c = SlurmCluster(names)
    with c:
        assert {n: s.state for n, s in c.node_states().items()} == dict.fromkeys(names, "idle")
        out = c.run(
            ["srun", "-N3", "-l", "sh", "-c", "echo $(hostname) $(ip -4 -o addr show eth0)"]
        )
        seen = {line.split()[1]: line for line in out.stdout.splitlines()}
        assert set(seen) == set(names)
        for name in names:
            assert c.host(name).addr + "/24" in seen[name]  # its own address, on the bridge
        daemons = [p.pid for p in c._procs.values()]
        hosts = list(c.bridge.hosts)
    assert not _leftovers(c)
    for pid in daemons:
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0
    assert all(
        h.netns not in subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
        for h in hosts
    )


def test_two_clusters_side_by_side_do_not_collide() -> None:
    require_cluster()
    with SlurmCluster(["node-0", "node-1"]) as a, SlurmCluster(["node-0", "node-1"]) as b:
        assert a.controller_addr != b.controller_addr
        a.run(["scontrol", "update", "NodeName=node-1", "State=DRAIN", "Reason=only in a"])
        assert a.node_states()["node-1"].state in {"drained", "draining"}
        assert b.node_states()["node-1"].state == "idle"
