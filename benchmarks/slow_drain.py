"""A drain that takes a slow scheduler's time, pending while `coordinator.py` measures ingest.

`--slow-drain S` points the coordinator's Slurm eviction backend at the stand-in `scontrol`
(tests/helpers/scontrol_standin.py: no Slurm controller here), whose every update takes S
seconds. Before each paced step a DBE on a node of a job starts that node's drain; the step
records whether the drain was still pending when it ended. The drain runs off the store's
thread, so the acknowledgements should not notice it (issue: a 30 s `scontrol` inside a store
transaction had held every commit).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from sentinel.protocol import (
    Action,
    EventBatch,
    EventKind,
    JobStatusPayload,
    NodeHealthPayload,
    Source,
    Verdict,
    XidReport,
    encode,
    make_event,
)

STANDIN = Path(__file__).resolve().parent.parent / "tests" / "helpers" / "scontrol_standin.py"
NODES = [f"drain-{i}" for i in range(8)]


def coordinator_env(state: Path, seconds: float) -> dict[str, str]:
    """The coordinator's and the stand-in's settings (an environment for both)."""
    return {
        "SENTINEL_COORDINATOR__EVICTION_BACKEND": "slurm",
        "SENTINEL_COORDINATOR__SCONTROL": str(STANDIN),
        "SENTINEL_COORDINATOR__EVICTION__MAX_PER_WINDOW": "1000",
        "SCONTROL_STATE": str(state / "slurm-nodes.json"),
        "SCONTROL_UPDATE_SLEEP_S": str(seconds),
    }


def _calls(state: Path) -> list[str]:
    log = state / "slurm-nodes.json.log"
    return log.read_text().splitlines() if log.exists() else []


def start(url: str, token: str, state: Path, step: int) -> str:
    """A DBE on one node of a job with spares; returns once its drain has begun."""
    node = NODES[step % len(NODES)]
    status = JobStatusPayload(
        state="running",
        generation=0,
        world_size=len(NODES),
        gpus_per_node=1,
        nodes=NODES,
        spares=[f"drain-spare-{i}" for i in range(8)],
    )
    xid = XidReport(gpu=0, xid=48, name="Double-bit ECC error", action=Action.RESET_GPU)
    health = NodeHealthPayload(verdict=Verdict.UNHEALTHY, action=Action.RESET_GPU, xids=[xid])
    batch = EventBatch(
        events=[
            make_event(EventKind.JOB_STATUS, Source(job=f"bench-{step}"), status),
            make_event(EventKind.NODE_HEALTH, Source(node=node), health),
        ]
    )
    req = urllib.request.Request(f"{url}/v1/events", data=encode(batch).encode(), method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    urllib.request.urlopen(req, timeout=10).close()
    deadline = time.monotonic() + 30
    while f"update {node}" not in _calls(state):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the drain of {node} never began: {json.dumps(_calls(state))}")
        time.sleep(0.05)
    return node


def pending(state: Path, node: str) -> bool:
    return f"drained {node}" not in _calls(state)
