"""The drill on a real Slurm cluster (`sentinel demo --fleet slurm`): four nodes and two spares,
a hardware fault (node drained in Slurm, spare swapped in), a crash (restart in place) and a
hang (every node's flight recorder dumped into its own directory, carried by its agent, the
culprit's node drained). The job's two data-parallel replicas are fault domains: the ECC fault
is repaired live (the other replica keeps stepping, the spare heals from it), the crash and the
hang by a warm restart of every rank; the run ends with the clean run's model up to the order of
the gradient sums, every sample consumed once."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from demo_checks import assert_same_model
from slurm_support import require_cluster

from sentinel.lab.demo.slurm import SlurmDemo
from sentinel.lab.slurm.cluster import SlurmCluster
from sentinel.scenario import Scenario

pytestmark = [pytest.mark.slow, pytest.mark.root]
SCENARIO = Path(__file__).parent / "slurm_drill.yaml"


@pytest.mark.timeout(1500)
def test_slurm_drill_repairs_three_faults_each_on_its_path(tmp_path: Path) -> None:
    require_cluster()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    out, result = tmp_path / "out", tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sentinel",
            "demo",
            "--fleet",
            "slurm",
            "--scenario",
            str(SCENARIO),
            "--quick",
            "--out",
            str(out),
            "--json",
            str(result),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    assert result.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    res = json.loads(result.read_text())
    assert res["verdict"] == "pass" and done.returncode == 0, done.stdout[-4000:]
    assert res["fleet"] == "slurm" and res["false_incidents"] == []
    faults = {f["kind"]: f for f in res["faults"]}
    assert all(f["detected"] for f in faults.values())
    assert faults["ecc_dbe"]["drained_node"] == "node-2"
    assert faults["crash"]["drained_node"] is None  # restarted in place
    assert faults["hang"]["target"] == "rank-3" and faults["hang"]["drained_node"] == "node-3"
    assert sorted(res["evicted_nodes"]) == ["node-2", "node-3"]
    for node in ("node-2", "node-3"):
        st = res["slurm_nodes"][node]
        assert st["state"] in {"drained", "draining"} and re.match(r"sentinel:\d+ ", st["reason"])
    paths = {k: f["repair_path"] for k, f in faults.items()}
    assert paths == {"ecc_dbe": "live", "crash": "warm_restart", "hang": "warm_restart"}, paths
    assert all(r["survivors_restarted"] == 0 for r in res["repairs"]), res["repairs"]
    assert_same_model(res)

    # the hang's dumps: written on each node, carried into the coordinator's store, never a
    # shared directory
    with sqlite3.connect(out / "coordinator" / "coordinator.db") as db:
        carried = {r[0] for r in db.execute("SELECT DISTINCT node FROM fr_dumps")}
    assert len(carried) >= 2, carried
    assert not any((out / "fr").glob("*")) if (out / "fr").exists() else True
    assert all(any((out / "nodes" / n / "fr").glob("*")) for n in carried)

    # checkpoints, one series per replica: each node wrote its ranks' part to its own fast tier,
    # and the shared durable tier, which the warm restarts resumed from, holds whole checkpoints
    # of each replica (its two TP ranks)
    parts = list((out / "nodes").glob("*/ckpt/replica-*/step-*/NODE_DONE"))
    assert {p.parents[3].name for p in parts} >= {"node-0", "node-1"}, parts
    assert not list((out / "nodes").glob("*/ckpt/replica-*/step-*/COMMITTED"))
    durable = [p.parent for p in (out / "ckpt").glob("replica-*/step-*/COMMITTED")]
    assert durable and all(len(list((d / "rng").iterdir())) == 2 for d in durable), durable

    # nothing of this cluster left behind: its namespaces and bridge are gone
    m = re.search(r"Slurm cluster up: .* on slb(\w+) ", done.stdout)
    assert m, done.stdout[:2000]
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"sln{m.group(1)}" not in netns and f"slb{m.group(1)}" not in links


@pytest.mark.timeout(300)
def test_slurm_burnin_finds_a_link_held_down_by_tc(tmp_path: Path) -> None:
    """The link fault on Slurm is a real one: every gang node's link held to the line rate by a
    token bucket, node-2's to a quarter of it; the burn-in, a job step across the namespaces,
    measures the links and keeps node-2 out."""
    require_cluster()
    scenario = Scenario.model_validate(
        {
            "name": "link",
            "fleet": {"nodes": 3, "gpus_per_node": 1, "spares": 1},
            "trainer": {"tp": 1, "pp": 1, "dp": 3, "steps": 10, "checkpoint_every": 5},
            "faults": [{"kind": "link_degraded", "node": "node-2", "factor": 0.25}],
        }
    )
    demo = SlurmDemo(scenario, tmp_path / "out", echo=lambda _line: None)
    demo.out.mkdir(parents=True)
    with SlurmCluster(["node-0", "node-1", "node-2", "spare-0"]) as cluster:
        demo.cluster = cluster
        exclude = demo.burnin()
        qdisc = subprocess.run(
            ["tc", "qdisc", "show", "dev", cluster.host("node-2").veth],
            capture_output=True,
            text=True,
        ).stdout
    assert exclude is not None and exclude.read_text().split() == ["node-2"]
    assert "tbf" in qdisc and "250Mbit" in qdisc, qdisc
    links = json.loads((demo.out / "burnin.json").read_text())["links"]
    slow = [pair["gbps"] for pair in links if "node-2" in (pair["a"], pair["b"])]
    fast = [pair["gbps"] for pair in links if "node-2" not in (pair["a"], pair["b"])]
    assert slow and fast and max(slow) < 0.5 * min(fast), links
