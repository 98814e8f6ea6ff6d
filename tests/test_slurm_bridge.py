"""The scheduler bridge on a real Slurm cluster, both ways: a real coordinator with the Slurm
backend polling `scontrol show node` every second (the shipped default is 10 s).

- An administrator drains a node of the job: within a poll it is an incident with the
  scheduler's reason, the job is moved off it (a restart command with a spare in its place),
  and the scheduler keeps its own reason.
- Sentinel's own eviction is a drain whose reason names its incident (`sentinel:<id> ...`),
  in `sinfo -R` within 2 s of the decision, and the bridge leaves it alone.
- Someone resumes that node by hand: an incident says it came back unvalidated, and Sentinel
  keeps it evicted.
- The controller stops: the polls fail, `sentinel_coordinator_scheduler_up` says so and counts
  them, and the last state stands (nothing is read as "no drains"); back, the polls read again.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from coord_util import Coordinator, job_status, wait_for, xid
from slurm_support import require_cluster

from sentinel.lab.slurm.cluster import SlurmCluster
from sentinel.protocol import EventBatch, encode

pytestmark = [pytest.mark.slow, pytest.mark.root]

NODES = ["node-0", "node-1", "node-2"]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[SlurmCluster, Coordinator]]:
    require_cluster()
    with SlurmCluster(NODES) as cluster:
        env = {
            "SLURM_CONF": str(cluster.conf),
            "SENTINEL_COORDINATOR__EVICTION_BACKEND": "slurm",
            "SENTINEL_COORDINATOR__SCHEDULER_POLL_S": "1",
            "SENTINEL_COORDINATOR__SCONTROL_TIMEOUT_S": "5",
        }
        (tmp_path / "state").mkdir()
        coord = Coordinator(tmp_path / "state", env=env)
        coord.start()
        try:
            yield cluster, coord
        finally:
            coord.stop()


def _incidents(coord: Coordinator, token: str) -> list[dict[str, Any]]:
    return list(coord.call("GET", "/v1/incidents", token))  # type: ignore[arg-type]


def _incident(coord: Coordinator, token: str, fault: str, node: str) -> dict[str, Any] | None:
    return next(
        (i for i in _incidents(coord, token) if i["fault"] == fault and i["target"] == node), None
    )


def _state(coord: Coordinator, node: str) -> str:
    with coord.db() as db:
        row = db.execute("SELECT state FROM nodes WHERE name=?", (node,)).fetchone()
    return str(row[0]) if row else ""


def _scheduler_series(coord: Coordinator, token: str) -> dict[str, float]:
    req = urllib.request.Request(
        f"{coord.url}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    pattern = r'^sentinel_coordinator_(scheduler_\w+)\{scheduler="slurm"\} (\S+)$'
    found = {name: float(v) for name, v in re.findall(pattern, text, re.M)}
    return {k: v for k, v in found.items() if not k.endswith("_created")}


def test_the_bridge_sees_drains_by_others_and_returns_by_hand_and_never_reads_a_failure_as_clean(
    fleet: tuple[SlurmCluster, Coordinator],
) -> None:
    cluster, coord = fleet
    admin = coord.token("--role", "admin")
    status = job_status("j", NODES, ["spare-0", "spare-1"])
    coord.call("POST", "/v1/events", admin, encode(EventBatch(events=[status])).encode())
    wait_for(lambda: _state(coord, "node-1") == "active", what="the job's nodes known")

    # an administrator drains node-1
    drained_at = time.monotonic()
    cluster.run(["scontrol", "update", "NodeName=node-1", "State=DRAIN", "Reason=fan replacement"])
    wait_for(
        lambda: _incident(coord, admin, "scheduler_drain", "node-1") is not None,
        timeout=10,
        what="an incident for the drain",
    )
    seen_s = time.monotonic() - drained_at
    wait_for(lambda: _state(coord, "node-1") == "evicted", what="node-1 recorded out")
    assert cluster.node_states()["node-1"].reason == "fan replacement"  # not drained again

    def restarts() -> list[dict[str, Any]]:
        with coord.db() as db:
            rows = db.execute("SELECT args FROM commands WHERE kind='job.restart'").fetchall()
        return [json.loads(r[0]) for r in rows]

    # the repair's resume step sends the job's restart with a spare for node-1 (its steps run
    # on the engine's ticks after the node is recorded out)
    wait_for(
        lambda: any(r["spare_map"] == {"node-1": "spare-0"} for r in restarts()),
        what="the job restarted with a spare for node-1",
    )

    # Sentinel's own eviction: a drain naming its incident, the bridge leaves it alone
    coord.call("POST", "/v1/events", admin, encode(EventBatch(events=[xid("node-0")])).encode())
    wait_for(lambda: _incident(coord, admin, "gpu_hardware", "node-0") is not None, what="XID")
    inc = _incident(coord, admin, "gpu_hardware", "node-0")
    assert inc is not None
    wait_for(
        lambda: cluster.node_states()["node-0"].reason.startswith(f"sentinel:{inc['id']} "),
        timeout=10,
        what="Sentinel's drain in sinfo -R",
    )
    drained = time.time()  # seen in sinfo by now (the coordinator's clock is this machine's)
    with coord.db() as db:
        (decided,) = db.execute(
            "SELECT started_at FROM actions WHERE action='evict_node' AND incident_id=?",
            (inc["id"],),
        ).fetchone()
    assert drained - decided <= 2.0, (decided, drained)
    assert cluster.node_states()["node-0"].reason == f"sentinel:{inc['id']} GPU hardware fault"
    time.sleep(2.5)  # two polls
    assert _incident(coord, admin, "scheduler_drain", "node-0") is None

    # someone resumes node-0 by hand: reported; still evicted for Sentinel
    cluster.run(["scontrol", "update", "NodeName=node-0", "State=RESUME"])
    wait_for(
        lambda: _incident(coord, admin, "unvalidated_return", "node-0") is not None,
        timeout=10,
        what="an incident for the return by hand",
    )
    assert _state(coord, "node-0") == "evicted"
    assert _scheduler_series(coord, admin) == {
        "scheduler_up": 1.0,
        "scheduler_poll_failures_total": 0.0,
    }

    # the controller stops: the polls fail and say so; nothing is taken as "no drains"
    before = (len(_incidents(coord, admin)), _state(coord, "node-1"), _state(coord, "node-0"))
    cluster.stop_controller()
    wait_for(
        lambda: _scheduler_series(coord, admin).get("scheduler_up") == 0.0,
        timeout=30,
        what="the failed poll in /metrics",
    )
    assert _scheduler_series(coord, admin)["scheduler_poll_failures_total"] >= 1
    assert (
        len(_incidents(coord, admin)),
        _state(coord, "node-1"),
        _state(coord, "node-0"),
    ) == before
    cluster.start_controller()
    wait_for(
        lambda: _scheduler_series(coord, admin).get("scheduler_up") == 1.0,
        timeout=30,
        what="the scheduler read again",
    )
    print(
        f"\nan administrator's drain became an incident in {seen_s:.2f} s; Sentinel's drain took {drained - decided:.3f} s"
    )
