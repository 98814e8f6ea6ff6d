"""Node agent benchmark: the real pynvml path on the fake NVML library, 8 H100-like GPUs.

    python benchmarks/agent.py [--sweeps N]

Builds the fake libnvidia-ml.so.1 in a temp dir and re-executes itself with LD_LIBRARY_PATH
pointing there (the loader reads it only at process start). Prints a JSON object as the last
line: `sweep_ms_p50`, `sweep_ms_p99` (one full collection sweep: every field of every GPU plus
draining XID events; wall clock) and the same as CPU time of the sweeping thread;
`urgent_cpu_us_p50` (the check between sweeps: XID events, DBE counts, temperatures);
`collect_ms_p50/p99` (the sweep plus judging it: rules and holds, rates, peer outliers);
`render_ms_p50` (one /metrics exposition of the agent's registry after a real sweep); and
`cpu_core_fraction`: a real `sentinel agent` process on the same fake library, collecting every
1 s and scraped every 15 s as Prometheus would, its CPU time / wall time over `--cpu-seconds`
(default 60). Targets: sweep <= 5 ms, render <= 5 ms, CPU <= 0.005 of a core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import fake_nvml  # noqa: E402  (tests/fake_nvml: the fake library and its config)
from stats import median, percentile  # noqa: E402  (benchmarks/stats.py)

GPUS = 8
_CHILD_FLAG = "SENTINEL_BENCH_FAKE_NVML"


def busy_node(gpus: int) -> list[fake_nvml.FakeGpu]:
    """8 H100 SXM on NVLink (18 links each), GPM on, two processes per GPU: a full node."""
    return [
        fake_nvml.FakeGpu(
            index=i,
            ecc_sbe_volatile=3,
            nvlink_replay=[1] * 18,
            processes=[(4000 + i, 60 << 30), (5000 + i, 1 << 30)],
        )
        for i in range(gpus)
    ]


def measure_sweep(sweeps: int, warmup: int = 20) -> dict[str, float]:
    """One sweep = read every GPU + drain XIDs, as the agent's collection loop does."""
    from sentinel.agent.nvml.backend import NvmlBackend

    with NvmlBackend() as backend:
        assert backend.gpu_count() == GPUS, backend.gpu_count()
        for _ in range(warmup):
            backend.sweep()
            backend.drain_xids()
        times_ms, cpu_ms = [], []
        for _ in range(sweeps):
            start, cpu_start = time.perf_counter(), time.thread_time()
            readings = backend.sweep()
            backend.drain_xids()
            times_ms.append((time.perf_counter() - start) * 1000)
            cpu_ms.append((time.thread_time() - cpu_start) * 1000)
        assert all(r.tensor_active is not None and not r.lost for r in readings)
        urgent_us = []
        for _ in range(sweeps):
            cpu_start = time.thread_time()
            backend.urgent(92.0)
            urgent_us.append((time.thread_time() - cpu_start) * 1e6)
    return {
        # The between-sweeps check (XID events, DBE counts, temperatures), CPU of its thread.
        "urgent_cpu_us_p50": round(median(urgent_us), 1),
        "gpus": GPUS,
        "sweeps": sweeps,
        "sweep_ms_p50": round(median(times_ms), 3),
        "sweep_ms_p99": round(percentile(times_ms, 0.99), 3),
        # CPU time of the sweeping thread: what the sweep costs without the waits a busy
        # machine adds (the wall-clock p99 includes time preempted by other processes).
        "sweep_cpu_ms_p50": round(median(cpu_ms), 3),
        "sweep_cpu_ms_p99": round(percentile(cpu_ms, 0.99), 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def measure_collect(collects: int, warmup: int = 20) -> dict[str, float]:
    """One collection as the agent runs it: the sweep plus judging it (rules with their holds,
    rates, peer outliers, XIDs) and building the snapshot and events."""
    from sentinel.agent.health.judge import HealthEvaluator
    from sentinel.agent.monitor import NodeMonitor
    from sentinel.agent.nvml.backend import NvmlBackend
    from sentinel.config import HealthThresholds

    with NvmlBackend() as backend:
        monitor = NodeMonitor(
            "bench-node", backend, None, HealthEvaluator(HealthThresholds()), expected_gpus=GPUS
        )
        for _ in range(warmup):
            monitor.collect()
        times_ms, cpu_ms = [], []
        for _ in range(collects):
            start, cpu_start = time.perf_counter(), time.thread_time()
            snapshot, _ = monitor.collect()
            times_ms.append((time.perf_counter() - start) * 1000)
            cpu_ms.append((time.thread_time() - cpu_start) * 1000)
        assert snapshot.health.verdict.value == "healthy", snapshot.health.findings
    return {
        "collect_ms_p50": round(median(times_ms), 3),
        "collect_ms_p99": round(percentile(times_ms, 0.99), 3),
        "collect_cpu_ms_p50": round(median(cpu_ms), 3),
        "collect_cpu_ms_p99": round(percentile(cpu_ms, 0.99), 3),
    }


def measure_render(renders: int = 300) -> dict[str, float]:
    """Exposition of the agent's full registry (Sentinel + dcgm-exporter series, verdicts, host,
    the agent's own metrics) after a real sweep: what one Prometheus scrape costs the agent."""
    from prometheus_client import generate_latest

    from sentinel.agent.export.exposition import TextRenderer
    from sentinel.agent.host import PsutilHost
    from sentinel.agent.nvml.backend import NvmlBackend
    from sentinel.agent.service import Agent
    from sentinel.config import AgentConfig

    cfg = AgentConfig(node_id="bench-node", rank_socket=None, kmsg="off")
    agent = Agent(cfg, NvmlBackend(), PsutilHost())
    agent.monitor.collect()
    renderer = TextRenderer()  # what the agent's /metrics handler serves with
    body = renderer.render(agent.registry)
    assert body == generate_latest(agent.registry)  # same bytes as prometheus_client's

    def timed(render: object) -> tuple[list[float], list[float]]:
        wall, cpu = [], []
        for _ in range(renders):
            start, cpu_start = time.perf_counter(), time.thread_time()
            render(agent.registry)  # type: ignore[operator]
            wall.append((time.perf_counter() - start) * 1000)
            cpu.append((time.thread_time() - cpu_start) * 1000)
        return wall, cpu

    wall, cpu = timed(renderer.render)
    _, base_cpu = timed(generate_latest)
    agent.backend.close()
    return {
        "render_ms_p50": round(median(wall), 3),
        "render_ms_p99": round(percentile(wall, 0.99), 3),
        "render_cpu_ms_p50": round(median(cpu), 3),
        # Baseline in the same run: prometheus_client's generate_latest on the same registry.
        "render_generate_latest_cpu_ms_p50": round(median(base_cpu), 3),
        "render_speedup_vs_generate_latest": round(median(base_cpu) / median(cpu), 2),
        "render_bytes": len(body),
        "render_samples": sum(1 for line in body.splitlines() if not line.startswith(b"#")),
    }


def measure_agent_cpu(seconds: float, scrape_every_s: float = 15.0) -> dict[str, float]:
    """CPU share of one core used by a real agent process at a 1 s collection interval."""
    import psutil

    from sentinel.processes import free_port, stop_process

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sentinel-bench-agent-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "sentinel",
            "agent",
            "--node-id",
            "bench-node",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "1",
            "--rank-socket",
            str(Path(tmp) / "agent.sock"),
            "--expected-gpus",
            str(GPUS),
        ]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            _wait_for(url)
            agent = psutil.Process(proc.pid)
            cpu0, t0 = sum(agent.cpu_times()[:2]), time.monotonic()
            next_scrape = t0
            while (now := time.monotonic()) - t0 < seconds:
                if now >= next_scrape:
                    urllib.request.urlopen(url, timeout=5).read()
                    next_scrape += scrape_every_s
                time.sleep(0.2)
            cpu1, t1 = sum(agent.cpu_times()[:2]), time.monotonic()
        finally:
            stop_process(proc, 10.0)
    return {
        "cpu_core_fraction": round((cpu1 - cpu0) / (t1 - t0), 5),
        "cpu_measured_s": round(t1 - t0, 1),
    }


def _wait_for(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def reexec_with_fake_nvml(tmp: Path) -> int:
    """Build the fake library, write the node's config, and run this script again with it."""
    lib_dir = fake_nvml.build_library(tmp / "lib")
    config = tmp / "fake-nvml.conf"
    fake_nvml.write_config(config, busy_node(GPUS))
    env = fake_nvml.fake_env(lib_dir, config) | {_CHILD_FLAG: "1"}
    args = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
    return subprocess.run(args, env=env, check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=500, help="timed sweeps (default 500)")
    parser.add_argument(
        "--cpu-seconds", type=float, default=60.0, help="agent CPU-share window (default 60)"
    )
    args = parser.parse_args()
    if os.environ.get(_CHILD_FLAG) != "1":
        with tempfile.TemporaryDirectory(prefix="sentinel-bench-") as tmp:
            return reexec_with_fake_nvml(Path(tmp))
    figures: dict[str, object] = {"benchmark": "agent"}
    figures |= measure_sweep(args.sweeps)
    figures |= measure_collect(args.sweeps)
    figures |= measure_render()
    figures |= measure_agent_cpu(args.cpu_seconds)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
