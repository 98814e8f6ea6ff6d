"""Validation before return, on real processes: a real coordinator, a real agent on simulated
GPUs, and the real validation burn-in the agent runs on the node.

node-1 is evicted (an XID). Its GPU still computes wrongly and 1.25x slowly (`sdc` and `slow`
in its simulated faults: silent in every NVML reading, so its agent reports it healthy). An
operator returns it: after the hold-down the agent validates the node, the recompute disagrees
with itself and the GEMM misses the baseline, and the node goes back to `evicted` with that
reason. The GPU is repaired (`clear`) but the node's network stack now carries 40% of its
bandwidth (`loopback`): the next return is refused for the loopback alone. Once that is
repaired too, the same request returns it. No return without a pass, at the shipped tolerances.
"""

from __future__ import annotations

import json
import time
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

from sentinel.agent.nvml.sim import inject
from sentinel.protocol import EventBatch, encode

pytestmark = pytest.mark.slow
NODE = "node-1"


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    """A healthy node's figures, recorded by the real command, with the shipped tolerances."""
    path = tmp_path / "baseline.json"
    doc = record_validation_baseline(path)
    assert (doc["gemm_tolerance"], doc["loopback_tolerance"]) == (0.2, 0.5)
    return path


@pytest.fixture
def fleet(tmp_path: Path, baseline: Path) -> Iterator[tuple[Coordinator, Path]]:
    faults = tmp_path / "faults.jsonl"
    inject(faults, {"kind": "sdc", "gpu": 0})
    inject(faults, {"kind": "slow", "gpu": 0, "slowdown": 1.25})
    with returning_node(tmp_path, NODE, faults, baseline) as coord:
        yield coord, faults


def _node(coord: Coordinator) -> tuple[str, str]:
    with coord.db() as db:
        row = db.execute("SELECT state, reason FROM nodes WHERE name=?", (NODE,)).fetchone()
    return (str(row[0]), str(row[1] or "")) if row else ("", "")


def test_a_still_faulty_node_stays_out_and_a_repaired_one_returns(
    fleet: tuple[Coordinator, Path],
) -> None:
    coord, faults = fleet
    admin, operator = coord.token("--role", "admin"), coord.token("--role", "operator")
    wait_for(lambda: _node(coord)[0] == "active", what="node-1's agent heard")
    events = EventBatch(events=[job_status("j", ["node-0", NODE], ["spare-0"]), xid(NODE)])
    coord.call("POST", "/v1/events", admin, encode(events).encode())
    wait_for(lambda: _node(coord)[0] == "evicted", what="node-1 evicted")
    incident = next(i for i in coord.call("GET", "/v1/incidents", admin) if i["target"] == NODE)  # type: ignore[union-attr,index]
    body = json.dumps(
        {
            "incident": incident["id"],
            "action": "return_node",
            "params": {"node": NODE},
            "why": "reseated",
        }
    ).encode()

    t0 = time.monotonic()
    coord.call("POST", "/v1/actions", operator, body)
    wait_for(lambda: _node(coord)[0] == "validating", what="validating")
    wait_for(lambda: _node(coord)[0] == "evicted", timeout=120, what="node-1 failed validation")
    failed_s = time.monotonic() - t0
    _, reason = _node(coord)
    assert "failed validation" in reason and "sdc: GPU 0" in reason and "gemm: GPU 0" in reason
    assert "loopback" not in reason  # its network is fine: only what is wrong is named
    view = coord.call("GET", f"/v1/incidents/{incident['id']}", admin)
    held = [a for a in view["actions"] if a["action"] == "return_node"]  # type: ignore[index]
    assert [a["state"] for a in held] == ["escalated"]
    checks = {c["name"]: c for c in held[0]["result"]["validation"]["checks"]}
    assert checks["gemm"]["value"] > checks["gemm"]["limit"] and checks["loopback"]["passed"]

    inject(faults, {"kind": "clear", "gpu": 0})  # the GPU repaired ...
    inject(faults, {"kind": "loopback", "factor": 0.4})  # ... and the host's network damaged
    coord.call("POST", "/v1/actions", operator, body)
    wait_for(lambda: _node(coord)[0] == "validating", what="validating again")
    wait_for(lambda: _node(coord)[0] == "evicted", timeout=120, what="refused for the loopback")
    _, reason = _node(coord)
    assert "loopback" in reason and "gemm" not in reason and "sdc" not in reason, reason

    inject(faults, {"kind": "loopback", "factor": 1.0})  # repaired
    t1 = time.monotonic()
    coord.call("POST", "/v1/actions", operator, body)
    wait_for(lambda: _node(coord)[0] == "returned", timeout=120, what="node-1 returned")
    print(
        f"\nfailed validation after {failed_s:.1f} s; returned after {time.monotonic() - t1:.1f} s"
    )
    with coord.db() as db:
        moves = [
            r[0]
            for r in db.execute(
                "SELECT what FROM audit WHERE what LIKE 'node.%' ORDER BY id"
            ).fetchall()
        ]
    assert moves[-6:] == ["node.validating", "node.evicted"] * 2 + [
        "node.validating",
        "node.returned",
    ]
