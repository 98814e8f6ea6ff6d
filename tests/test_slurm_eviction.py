"""The Slurm eviction backend against a real cluster: a playbook drains the node with its reason
and incident id (seen in `sinfo`), an operator returns it (audited), and a controller that cannot
be reached escalates the incident with scontrol's error and loses nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from coord_util import Coordinator, job_status, wait_for, xid
from slurm_support import require_cluster

from sentinel.burnin.baseline import ValidationBaseline, save_validation_baseline
from sentinel.lab.slurm.cluster import SlurmCluster
from sentinel.protocol import (
    AgentHeartbeatPayload,
    EventBatch,
    EventKind,
    NodeValidationPayload,
    Source,
    Verdict,
    encode,
    make_event,
)

pytestmark = [pytest.mark.slow, pytest.mark.root]

NODES = ["node-0", "node-1", "node-2", "spare-0"]


@pytest.fixture
def slurm_coord(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[SlurmCluster, Coordinator]]:
    require_cluster()
    with SlurmCluster(NODES) as cluster:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        monkeypatch.setenv("SENTINEL_COORDINATOR__EVICTION_BACKEND", "slurm")
        monkeypatch.setenv("SENTINEL_COORDINATOR__SCONTROL_TIMEOUT_S", "20")
        # a returned node is held for its validation in a reservation admitting this user
        monkeypatch.setenv("SENTINEL_COORDINATOR__SLURM_VALIDATION_USER", "root")
        baseline = tmp_path / "baseline.json"  # node-1's validation is answered by the test
        save_validation_baseline(
            baseline,
            ValidationBaseline(
                gemm_s=0.002,
                gemm_size=384,
                loopback_gbps=1.0,
                loopback_bytes=1 << 24,
                sdc_digest="abc",
                device="cpu",
            ),
        )
        monkeypatch.setenv("SENTINEL_COORDINATOR__VALIDATION__BASELINE", str(baseline))
        monkeypatch.setenv("SENTINEL_COORDINATOR__VALIDATION__HOLD_DOWN_S", "0")
        coord = Coordinator(tmp_path / "state")
        coord.start()
        try:
            yield cluster, coord
        finally:
            assert coord.proc is not None
            coord.proc.terminate()
            coord.proc.wait(10)


def _post(coord: Coordinator, token: str, *events: object) -> None:
    coord.call("POST", "/v1/events", token, encode(EventBatch(events=list(events))).encode())


def _validated(coord: Coordinator, token: str, node: str) -> None:
    """Stand in for node-1's agent (no agent runs here): healthy, and a passed validation."""
    beat = make_event(
        EventKind.AGENT_HEARTBEAT,
        Source(node=node),
        AgentHeartbeatPayload(gpus=1, verdict=Verdict.HEALTHY, agent_version="t"),
    )
    _post(coord, token, beat)

    def asked() -> str | None:
        with coord.db() as db:
            row = db.execute("SELECT id FROM commands WHERE kind='node.validate'").fetchone()
        return str(row[0]) if row else None

    wait_for(lambda: asked() is not None, what="node-1 asked to validate")
    answer = NodeValidationPayload(request_id=str(asked()), passed=True)
    _post(coord, token, make_event(EventKind.NODE_VALIDATION, Source(node=node), answer))


def _incident(coord: Coordinator, token: str, node: str) -> dict:
    incidents = coord.call("GET", "/v1/incidents", token)
    return next(i for i in incidents if i["target"] == node)


def test_drain_in_sinfo_and_an_audited_return(
    slurm_coord: tuple[SlurmCluster, Coordinator],
) -> None:
    cluster, coord = slurm_coord
    admin, operator = coord.token("--role", "admin"), coord.token("--role", "operator")
    _post(coord, admin, job_status("j", NODES[:3], ["spare-0"]), xid("node-1"))
    wait_for(
        lambda: cluster.node_states()["node-1"].state in {"drained", "draining"},
        what="node-1 drained in Slurm",
    )
    inc = _incident(coord, operator, "node-1")
    assert cluster.node_states()["node-1"].reason == (f"sentinel:{inc['id']} GPU hardware fault")
    assert {n: s.state for n, s in cluster.node_states().items() if n != "node-1"} == dict.fromkeys(
        ["node-0", "node-2", "spare-0"], "idle"
    )

    # a job token may not return a node; an operator may, and it is audited with the why
    job = coord.token("--role", "job", "--job", "j")
    body = {
        "incident": inc["id"],
        "action": "return_node",
        "params": {"node": "node-1"},
        "why": "GPU reseated, burn-in passed",
    }
    with pytest.raises(Exception, match="403"):
        coord.call("POST", "/v1/actions", job, json.dumps(body).encode())
    assert cluster.node_states()["node-1"].state in {"drained", "draining"}
    coord.call("POST", "/v1/actions", operator, json.dumps(body).encode())
    _validated(coord, admin, "node-1")
    wait_for(lambda: cluster.node_states()["node-1"].state == "idle", what="node-1 resumed")

    def fleet_state() -> str:
        with coord.db() as db:
            return str(db.execute("SELECT state FROM nodes WHERE name='node-1'").fetchone()[0])

    # validating while scontrol is asked, then returned once its outcome is recorded (Slurm may
    # show the node idle a moment before): back in service, free to serve as a spare again
    wait_for(lambda: fleet_state() == "returned", what="node-1 returned in the fleet")

    def audit_of_return() -> list[Any]:
        with coord.db() as db:
            return list(
                db.execute(
                    "SELECT who, what, why FROM audit WHERE what LIKE '%return_node' ORDER BY id"
                ).fetchall()
            )

    # the return step ends on the engine's next pass after the effect recorded the node returned
    wait_for(lambda: len(audit_of_return()) == 2, what="the return step's audit entry")
    audit = audit_of_return()
    assert [a["what"] for a in audit] == ["manual.return_node", "action.return_node"]
    assert all(a["who"].startswith("operator:") for a in audit)
    assert audit[0]["why"] == "GPU reseated, burn-in passed"


def test_unreachable_controller_escalates_and_loses_nothing(
    slurm_coord: tuple[SlurmCluster, Coordinator],
) -> None:
    cluster, coord = slurm_coord
    admin = coord.token("--role", "admin")
    cluster.stop_controller()
    _post(coord, admin, job_status("j", NODES[:3], ["spare-0"]), xid("node-2"))

    def escalated() -> bool:
        return _incident(coord, admin, "node-2")["state"] == "escalated"

    wait_for(escalated, timeout=60, what="the incident escalated")
    inc = coord.call("GET", f"/v1/incidents/{_incident(coord, admin, 'node-2')['id']}", admin)
    evict = next(a for a in inc["actions"] if a["action"] == "evict_node")  # type: ignore[index]
    assert evict["state"] == "escalated"
    assert "scontrol update NodeName=node-2" in evict["result"]["error"]
    assert "controller" in evict["result"]["error"].lower()  # Slurm's own words
    with coord.db() as db:  # nothing recorded as done that was not
        row = db.execute("SELECT state FROM nodes WHERE name='node-2'").fetchone()
        assert row is None or row[0] != "evicted"

    # the controller is back; an operator retries the escalated run and the node drains
    cluster.start_controller()
    coord.call("POST", f"/v1/incidents/{inc['id']}/approve", admin, b"{}")  # type: ignore[index]
    wait_for(
        lambda: cluster.node_states()["node-2"].state in {"drained", "draining"},
        timeout=60,
        what="node-2 drained after the retry",
    )
    assert cluster.node_states()["node-2"].reason.startswith(f"sentinel:{inc['id']} ")  # type: ignore[index]
