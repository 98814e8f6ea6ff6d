"""drift: one drifted node named among 2,048 (`sentinel fleet drift`), through a real coordinator.

A coordinator process of its own (SQLite); every node's agent has reported its fingerprint 24
times (a day of the agent's hourly resend: the store holds every report until retention, and
the read must find each node's latest), ~50 fields each: driver, CUDA, 8 GPUs' name, VBIOS,
InfoROM, persistence and ECC mode, kernel, Python, torch, NCCL and the NCCL_* / FI_*
environment. In the last round, node-1337 reports another driver. Timed: the coordinator's own
time for the judgement (`seconds` in its answer: reading the latest fingerprints and judging
them), the request end to end, and, as the baseline measured in the same run, the judgement
alone in this process. Target (issue #34): <= 1 s of coordinator time. Last line: JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.coordinator import _make_tokens
from sentinel.fingerprint import drift
from sentinel.processes import free_port, stop_process, wait_ready
from sentinel.protocol import (
    AgentFingerprintEvent,
    AgentFingerprintPayload,
    EventBatch,
    Source,
    encode,
)
from sentinel.status import Client

NODES, ROUNDS, DRIFTED = 2048, 24, "node-1337"
TARGET_S = 1.0
ENV = {
    "env.NCCL_IB_HCA": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
    "env.NCCL_SOCKET_IFNAME": "eth0",
    "env.NCCL_NVLS_ENABLE": "1",
    "env.NCCL_CROSS_NIC": "0",
    "env.FI_PROVIDER": "efa",
    "env.FI_EFA_USE_DEVICE_RDMA": "1",
}


def fingerprint(node: str, last_round: bool) -> dict[str, str]:
    fields = {
        "driver": "550.54.15" if node == DRIFTED and last_round else "570.124.06",
        "cuda_driver": "12.8",
        "kernel": "6.8.0-1015-nvidia",
        "python": "3.11.7",
        "torch": "2.13.0",
        "nccl": "2.27.3",
        **ENV,
    }
    for gpu in range(8):
        fields |= {
            f"gpu.{gpu}.name": "NVIDIA H200",
            f"gpu.{gpu}.vbios": "96.00.A5.00.01",
            f"gpu.{gpu}.inforom": "G525.0225.00.03",
            f"gpu.{gpu}.persistence": "on",
            f"gpu.{gpu}.ecc": "on",
        }
    return fields


def report(url: str, admin: str) -> None:
    """Every round of every node's reports, 512 events a batch (the admin token may post for
    any node: the loading is not what is measured)."""
    for rnd in range(ROUNDS):
        events = [
            AgentFingerprintEvent(
                source=Source(node=f"node-{i}"),
                ts=1_800_000_000.0 + 3600 * rnd,
                payload=AgentFingerprintPayload(
                    fields=fingerprint(f"node-{i}", last_round=rnd == ROUNDS - 1)
                ),
            )
            for i in range(NODES)
        ]
        for start in range(0, NODES, 512):
            body = encode(EventBatch(events=events[start : start + 512])).encode()
            req = urllib.request.Request(
                f"{url}/v1/events",
                data=body,
                method="POST",
                headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=120).close()


def _up(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/healthz", timeout=1).close()
        return True
    except OSError:
        return False


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        admin, _ = _make_tokens(state, None, 0)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(tmp) / "coordinator.log"
        argv = [sys.executable, "-m", "sentinel", "coordinator", "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.Popen(
            [*argv, "--state-dir", str(state)], stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        try:
            wait_ready(lambda: _up(url), proc, what="coordinator", log=log, timeout_s=60)
            t0 = time.perf_counter()
            report(url, admin)
            loaded_s = time.perf_counter() - t0
            client = Client(url, admin, timeout_s=60)
            answers, walls = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                answers.append(client.call("GET", "/v1/fleet/drift"))
                walls.append(time.perf_counter() - t0)
        finally:
            stop_process(proc, 10.0)
    prints = {f"node-{i}": fingerprint(f"node-{i}", True) for i in range(NODES)}
    t0 = time.perf_counter()
    alone = drift(prints)
    judge_s = time.perf_counter() - t0
    doc = answers[-1]
    named = [d["node"] for d in doc["drifted"]]
    seconds = [a["seconds"] for a in answers]
    print(f"{ROUNDS * NODES} fingerprint reports of {NODES} nodes stored in {loaded_s:.1f} s")
    print(f"named {named}: {doc['drifted'][0]['reason'] if named else 'nothing'}")
    print(
        json.dumps(
            {
                "nodes": doc["nodes"],
                "named": named,
                "seconds": max(seconds),
                "seconds_median": statistics.median(seconds),
                "request_s_median": round(statistics.median(walls), 4),
                "judge_only_s": round(judge_s, 4),
                "ratio_to_judge_only": round(max(seconds) / judge_s, 1),
                "fields_per_node": len(prints["node-0"]),
                "reports_stored": ROUNDS * NODES,
                "target_s": TARGET_S,
                "met": named == [DRIFTED] and alone[0].node == DRIFTED and max(seconds) <= TARGET_S,
                "loadavg": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
