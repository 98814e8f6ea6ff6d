"""Node agent benchmark: the real pynvml path on the fake NVML library, 8 H100-like GPUs.

    python benchmarks/agent.py [--sweeps N]

Builds the fake libnvidia-ml.so.1 in a temp dir and re-executes itself with LD_LIBRARY_PATH
pointing there (the loader reads it only at process start). Prints a JSON object as the last
line: `sweep_ms_p50`, `sweep_ms_p99` (one full collection sweep: every field of every GPU plus
draining XID events; wall clock) and the same as CPU time of the sweeping thread. Targets:
sweep <= 5 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import fake_nvml  # noqa: E402  (tests/fake_nvml: the fake library and its config)

GPUS = 8
_CHILD_FLAG = "SENTINEL_BENCH_FAKE_NVML"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
    from sentinel.agent.nvml import NvmlBackend

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
    return {
        "gpus": GPUS,
        "sweeps": sweeps,
        "sweep_ms_p50": round(statistics.median(times_ms), 3),
        "sweep_ms_p99": round(percentile(times_ms, 0.99), 3),
        # CPU time of the sweeping thread: what the sweep costs without the waits a busy
        # machine adds (the wall-clock p99 includes time preempted by other processes).
        "sweep_cpu_ms_p50": round(statistics.median(cpu_ms), 3),
        "sweep_cpu_ms_p99": round(percentile(cpu_ms, 0.99), 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


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
    args = parser.parse_args()
    if os.environ.get(_CHILD_FLAG) != "1":
        with tempfile.TemporaryDirectory(prefix="sentinel-bench-") as tmp:
            return reexec_with_fake_nvml(Path(tmp))
    figures: dict[str, object] = {"benchmark": "agent"}
    figures |= measure_sweep(args.sweeps)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
