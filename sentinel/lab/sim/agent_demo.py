"""What an operator sees when GPUs fail: a simulated fleet of node agents, two hardware faults.

Starts 4 agents x 8 simulated H100s as real processes, injects a double-bit ECC error on one
node and an XID 79 (GPU fallen off the bus) on another, and prints the verdicts, recommended
actions and the metric lines a Prometheus scrape returns. Ends by itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sentinel.lab.sim.fleet import AgentProcess, SimFleet

WATCH = (
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
    "sentinel_gpu_xid_errors_total",
    "sentinel_gpu_lost",
    "sentinel_gpu_health_verdict",
    "sentinel_gpu_health_finding",
    "sentinel_node_health_verdict",
    "sentinel_node_recommended_action",
)


def node_state(a: AgentProcess) -> tuple[str, str, str]:
    """(verdict, action, firing rules) as read back from the agent's /metrics."""
    samples = a.scrape()

    def active(name: str, label: str) -> list[str]:
        return [f"{lbl[label]}" for lbl, v in samples.get(name, []) if v == 1]

    rules = [
        f"gpu {lbl['gpu']}: {lbl['rule']}"
        for lbl, v in samples.get("sentinel_gpu_health_finding", [])
        if v == 1
    ]
    verdict = active("sentinel_node_health_verdict", "verdict") or ["?"]
    action = active("sentinel_node_recommended_action", "action") or ["?"]
    return verdict[0], action[0], ", ".join(rules) or "-"


def print_table(fleet: SimFleet, title: str) -> None:
    print(f"\n{title}")
    print(f"  {'node':<8} {'verdict':<10} {'recommended action':<19} why")
    for a in fleet.agents.values():
        verdict, action, why = node_state(a)
        print(f"  {a.node_id:<8} {verdict:<10} {action:<19} {why}")


def print_scrape(a: AgentProcess, gpu: str) -> None:
    print(f"\n  what a Prometheus scrape of {a.url}/metrics returns for GPU {gpu}:")
    text = a.get("/metrics").decode()
    for line in text.splitlines():
        if line.startswith(WATCH) and (f'gpu="{gpu}"' in line or "node_" in line):
            if line.rstrip().endswith(" 0.0") and ("verdict" in line or "action" in line):
                continue  # the inactive members of the verdict and action state sets
            print(f"    {line}")


def wait_for(fleet: SimFleet, node: str, verdict: str, timeout_s: float = 20.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if node_state(fleet.agents[node])[0] == verdict:
            return time.monotonic() - start
        time.sleep(0.1)
    raise TimeoutError(f"{node} did not become {verdict} within {timeout_s}s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sentinel-demo-") as tmp:
        fleet = SimFleet(
            Path(tmp), [f"node-{k}" for k in range(args.nodes)], args.gpus, interval_s=args.interval
        )
        print(f"starting {args.nodes} node agents x {args.gpus} simulated GPUs ...")
        with fleet:
            print_table(fleet, "fleet at start:")
            print("\n>>> injecting a double-bit ECC error on node-2 GPU 0")
            fleet.inject("node-2", {"kind": "ecc_dbe", "gpu": 0})
            print(">>> injecting XID 79 (GPU fallen off the bus) on node-1 GPU 3")
            fleet.inject("node-1", {"kind": "xid", "gpu": 3, "xid": 79})
            t2 = wait_for(fleet, "node-2", "unhealthy")
            t1 = wait_for(fleet, "node-1", "unhealthy")
            print(
                f"    detected: node-2 after {t2:.2f}s, node-1 after {t1:.2f}s "
                f"(collection interval {args.interval}s)"
            )
            print_table(fleet, "fleet after the faults:")
            print_scrape(fleet.agents["node-2"], "0")
            print_scrape(fleet.agents["node-1"], "3")
        print("\nagents stopped cleanly; demo done.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
