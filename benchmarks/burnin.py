"""Burn-in benchmark: measurement overhead and quick-mode wall time.

- busbw_efficiency: Sentinel's all_reduce busbw / a bare torch.distributed timing loop's busbw,
  on the same 8 simulated ranks, sizes and backend (gloo), in one run, interleaved so both see
  the same machine. Target >= 0.95.
- quick_s: wall time of `sentinel burnin --sim-nodes 4 --gpus-per-node 2 --quick`.
- straggler screen: `--straggler-runs N` (default 10) process-level runs of
  `sentinel burnin --sim-nodes 4 --gpus-per-node 2 --phases stragglers` with rank 5's GPU 1.05x
  slow (busy, not asleep: `sentinel.burnin.faults`), and N runs with no fault.
  `straggler_flagged_runs`: runs that flagged rank 5 and no other rank (target >= 9 of 10);
  `straggler_clean_false_runs`: clean runs that flagged any rank (target 0 of 10). Each run's
  flagged ranks and the slow rank's relative GEMM time are listed; the machine's load average
  is reported with them, as timings on a shared machine are noisy.

Run: python benchmarks/burnin.py [--skip-quick] [--straggler-runs N]; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES, GPUS = 4, 2
SIZES = [1 << 18, 1 << 20, 1 << 22]
WARMUP, ITERS, REPS = 2, 8, 4


def bare_busbw(size: int) -> float:
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    t = torch.ones(size // 4)
    for _ in range(WARMUP):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(t)
    took = torch.tensor([(time.perf_counter() - t0) / ITERS], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return size / float(took) / 1e9 * 2 * (n - 1) / n


def rank_main(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from sentinel.burnin import collectives
    from sentinel.burnin.comm import Comm

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes: list[object] = [None] * world
    dist.all_gather_object(nodes, os.environ["SENTINEL_NODE"])
    comm = Comm(rank, world, [str(x) for x in nodes], torch.device("cpu"))
    best: dict[str, dict[int, float]] = {"sentinel": {}, "bare": {}}

    def sentinel_busbw(size: int) -> float:
        return float(collectives.measure(comm, "all_reduce", size, WARMUP, ITERS)["busbw_gbps"])

    for rep in range(REPS):
        for size in SIZES:
            # alternate who goes first, so neither always meets a warmer (or busier) machine
            order = [("sentinel", sentinel_busbw), ("bare", bare_busbw)]
            for name, fn in order if rep % 2 == 0 else order[::-1]:
                best[name][size] = max(best[name].get(size, 0.0), fn(size))
    dist.destroy_process_group()
    if rank == 0:
        out.write_text(json.dumps(best))


def busbw_efficiency() -> dict[str, object]:
    from sentinel.lab.sim.burnin import spawn_fleet

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bw.json"
        code = spawn_fleet(NODES, GPUS, [sys.executable, __file__, "--rank", str(out)])
        if code:
            raise SystemExit(f"benchmark ranks failed with exit code {code}")
        best = json.loads(out.read_text())
    ratios = {s: best["sentinel"][s] / best["bare"][s] for s in best["sentinel"]}
    return {
        "busbw_efficiency": round(sum(ratios.values()) / len(ratios), 4),
        "busbw_gbps": {k: {s: round(v, 4) for s, v in d.items()} for k, d in best.items()},
    }


def quick_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sentinel",
            "burnin",
            "--sim-nodes",
            str(NODES),
            "--gpus-per-node",
            str(GPUS),
            "--quick",
            "--no-progress",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return round(time.perf_counter() - t0, 1)


SLOW_RANK, SLOWDOWN = 5, 1.05
STRAGGLER_SCENARIO = f"""
fleet: {{nodes: {NODES}, gpus_per_node: {GPUS}, spares: 0}}
trainer: {{tp: 2, pp: 2, dp: 2}}
faults:
  - {{kind: straggler, rank: {SLOW_RANK}, slowdown: {SLOWDOWN}}}
"""


def straggler_run(tmp: Path, slow: bool) -> dict[str, object]:
    """One process-level straggler screen of the simulated 8-rank gang."""
    report = tmp / "report.json"
    cmd = [sys.executable, "-m", "sentinel", "burnin", "--sim-nodes", str(NODES)]
    cmd += ["--gpus-per-node", str(GPUS), "--phases", "stragglers", "--no-progress"]
    cmd += ["--json", str(report)]
    if slow:
        (tmp / "slow.yaml").write_text(STRAGGLER_SCENARIO)
        cmd += ["--scenario", str(tmp / "slow.yaml")]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=900)
    rep = json.loads(report.read_text())
    rel = rep["straggler_detail"]["ranks"][str(SLOW_RANK)].get("relative_time")
    return {"flagged": rep["stragglers"], "rank5_relative_time": rel, "load": os.getloadavg()[0]}


def straggler_screen(runs: int) -> dict[str, object]:
    slow, clean = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):  # alternate, so both kinds of run see the same machine
            slow.append(straggler_run(Path(tmp), slow=True))
            clean.append(straggler_run(Path(tmp), slow=False))
            print(f"straggler screen: slow {slow[-1]}, clean {clean[-1]}", file=sys.stderr)
    return {
        "straggler_slowdown": SLOWDOWN,
        "straggler_runs": runs,
        "straggler_flagged_runs": sum(r["flagged"] == [SLOW_RANK] for r in slow),
        "straggler_clean_false_runs": sum(bool(r["flagged"]) for r in clean),
        "straggler_slow_runs_detail": slow,
        "straggler_clean_runs_detail": clean,
    }


def main() -> None:
    if sys.argv[1:2] == ["--rank"]:
        rank_main(Path(sys.argv[2]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--skip-quick", action="store_true")
    p.add_argument("--skip-busbw", action="store_true")
    p.add_argument("--straggler-runs", type=int, default=10)
    args = p.parse_args()
    result: dict[str, object] = {"ranks": NODES * GPUS, "backend": "gloo", "sizes": SIZES}
    if not args.skip_busbw:
        result.update(busbw_efficiency())
    if not args.skip_quick:
        result["quick_s"] = quick_seconds()
    if args.straggler_runs:
        result.update(straggler_screen(args.straggler_runs))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
