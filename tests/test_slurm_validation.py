"""Validation before return as a Slurm job step, end to end on a real cluster: a real
coordinator with the Slurm backend, a real agent for node-1 (simulated GPUs) whose launcher is
`slurm`, and the real validation burn-in, run by slurmd on node-1 inside the maintenance
reservation the coordinator holds the node in.

node-1 is drained for an XID while its GPU still computes wrongly (`sdc`, silent in NVML). An
operator returns it: the node is resumed into `sentinel-validate-node-1` (no other job can land
there), the burn-in runs there and fails, and the node is drained again with the reason and the
reservation ended. Once the GPU is repaired, the same request returns it: in service in Slurm,
the reservation gone, and the verdict says where it ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from coord_util import (
    Coordinator,
    job_status,
    record_validation_baseline,
    returning_node,
    wait_for,
    xid,
)
from slurm_support import require_cluster

from sentinel.agent.nvml.sim import inject
from sentinel.lab.slurm.cluster import SlurmCluster
from sentinel.protocol import EventBatch, encode

pytestmark = [pytest.mark.slow, pytest.mark.root]
NODE = "node-1"
RESERVATION = "sentinel-validate-node-1"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[SlurmCluster, Coordinator, Path]]:
    require_cluster()
    baseline = tmp_path / "baseline.json"  # a healthy node's figures, at the shipped tolerances
    record_validation_baseline(baseline)
    faults = tmp_path / "faults.jsonl"
    inject(faults, {"kind": "sdc", "gpu": 0})
    with SlurmCluster(["node-0", NODE]) as cluster:
        slurm = {"SLURM_CONF": str(cluster.conf)}
        coordinator = {
            **slurm,
            "SENTINEL_COORDINATOR__EVICTION_BACKEND": "slurm",
            # the user this test's agent runs as
            "SENTINEL_COORDINATOR__SLURM_VALIDATION_USER": "root",
        }
        agent = {
            **slurm,
            "SENTINEL_AGENT__VALIDATION__LAUNCHER": "slurm",
            "SENTINEL_AGENT__VALIDATION__WORKDIR": str(tmp_path / "validate"),
        }
        with returning_node(tmp_path, NODE, faults, baseline, coordinator, agent) as coord:
            yield cluster, coord, faults


def _fleet_state(coord: Coordinator) -> tuple[str, str]:
    with coord.db() as db:
        row = db.execute("SELECT state, reason FROM nodes WHERE name=?", (NODE,)).fetchone()
    return (str(row[0]), str(row[1] or "")) if row else ("", "")


def _reserved(cluster: SlurmCluster) -> bool:
    done = cluster.run(["scontrol", "show", "reservation", RESERVATION], check=False)
    return done.returncode == 0


def _validation(coord: Coordinator, token: str, incident: int) -> dict:
    view = coord.call("GET", f"/v1/incidents/{incident}", token)
    returns = [a for a in view["actions"] if a["action"] == "return_node"]  # type: ignore[index]
    return dict(returns[-1]["result"]["validation"])


def test_a_returned_node_is_validated_by_a_job_step_in_its_own_reservation(
    fleet: tuple[SlurmCluster, Coordinator, Path],
) -> None:
    cluster, coord, faults = fleet
    admin, operator = coord.token("--role", "admin"), coord.token("--role", "operator")
    wait_for(lambda: _fleet_state(coord)[0] == "active", what="node-1's agent heard")
    events = EventBatch(events=[job_status("j", ["node-0", NODE], ["spare-0"]), xid(NODE)])
    coord.call("POST", "/v1/events", admin, encode(events).encode())
    wait_for(lambda: cluster.node_states()[NODE].state == "drained", what="node-1 drained")
    incident = next(i for i in coord.call("GET", "/v1/incidents", admin) if i["target"] == NODE)  # type: ignore[union-attr,index]
    body = {"incident": incident["id"], "action": "return_node", "params": {"node": NODE}}
    ask = json.dumps(body | {"why": "reseated"}).encode()

    coord.call("POST", "/v1/actions", operator, ask)
    # held: resumed into its own reservation, which admits no other job
    wait_for(lambda: _reserved(cluster), what="node-1 held in its reservation")
    wait_for(lambda: _fleet_state(coord)[0] == "evicted", timeout=120, what="failed validation")
    assert "failed validation" in _fleet_state(coord)[1] and "sdc: GPU 0" in _fleet_state(coord)[1]
    # released: drained again with the reason, then the reservation ended
    wait_for(lambda: not _reserved(cluster), what="the reservation ended")
    slurm = cluster.node_states()[NODE]
    assert slurm.state == "drained" and "failed validation" in slurm.reason, slurm
    assert slurm.reason.startswith(f"sentinel:{incident['id']} ")

    inject(faults, {"kind": "clear", "gpu": 0})  # the GPU repaired
    coord.call("POST", "/v1/actions", operator, ask)
    wait_for(lambda: _fleet_state(coord)[0] == "returned", timeout=120, what="node-1 returned")
    assert not _reserved(cluster)
    assert cluster.node_states()[NODE].state == "idle"
    ran = _validation(coord, admin, incident["id"])["ran"]
    assert ran == f"a Slurm job step in reservation {RESERVATION} on {NODE}", ran
    # and Slurm gives it work again like any node
    assert cluster.run(["srun", "-w", NODE, "-N1", "hostname"]).stdout.strip() == NODE
