"""hook_overhead_ratio: step time with every hook on / without hooks, same run, interleaved.

Two gloo ranks train a small MLP with an explicit gradient all-reduce (a plain DDP-style loop).
Steps alternate (in pairs of one-step blocks, each pair in a random order) between the
instrumented loop (step context,
observe(loss, grad_norm), wrapped collectives, step reports, the gang exchange every 20 steps,
watchdog and transport threads, an absent agent so events queue locally) and the bare loop.
Reported for rank 0: `hook_overhead_ratio`, the ratio of the median step times;
`trimmed_mean_ratio`, which also counts the periodic work (exchange, reports); and
`cpu_time_ratio`, the same with the process's CPU time per step (all its threads), which other
tenants of a shared machine do not disturb; and `hook_calls_ratio`, (bare step + mean time
spent inside the hooks' calls) / bare step, the hooks' own cost on the step's critical path
without any noise from the machine. Target <= 1.01 on CPU.

`reference_hook_overhead_ratio`: the reference trainer (TP2 x PP2 x DP2, 8 gloo ranks, the demo
configuration) with every hook on / with `SENTINEL_HOOKS_ENABLED=0`, whole runs alternated
(on, off, on, off, ...) in the same benchmark run; the ratio of median step times over all
on-runs and all off-runs, warm-up steps dropped. Skip it with `--no-reference`.
Last line of output: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_hooks import HooksConfig, SentinelHooks


def schedule(steps: int, block: int, seed: int = 0) -> list[bool]:
    """On/off per step: pairs of blocks in a random order (the same on every rank), so neither
    arm always runs first or on the same step parity."""
    rng = random.Random(seed)
    out: list[bool] = []
    while len(out) < steps:
        first = rng.random() < 0.5
        out += [first] * block + [not first] * block
    return out[:steps]


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tmp = tempfile.mkdtemp()
    hooks = SentinelHooks(
        HooksConfig(agent_socket=f"{tmp}/absent.sock", report_every=10, exchange_every=20),
        model=model,
    )
    x = torch.randn(64, 256)
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    inside: list[float] = []  # time spent inside the hooks' own calls, per instrumented step
    for step, on in enumerate(schedule(args.steps, args.block)):
        t0, c0 = time.perf_counter(), time.process_time()
        spent = 0.0
        if on:
            spent -= time.perf_counter()
            hooks.begin_step(step, tokens=64)
            spent += time.perf_counter()
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat)
        grad_norm = flat.norm()
        if on:
            spent -= time.perf_counter()
            hooks.observe(loss=loss.detach(), grad_norm=grad_norm)
            spent += time.perf_counter()
        opt.step()
        opt.zero_grad()
        if on:
            spent -= time.perf_counter()
            hooks.end_step()
            spent += time.perf_counter()
        if step >= args.warmup:
            times[on].append(time.perf_counter() - t0)
            cpu[on].append(time.process_time() - c0)
            if on:
                inside.append(spent)
    hooks.close()
    if rank == 0:
        result = {
            "on": times[True],
            "off": times[False],
            "cpu_on": cpu[True],
            "cpu_off": cpu[False],
            "inside": inside,
            "errors": hooks.errors,
        }
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _trimmed_mean(values: list[float], cut: float = 0.02) -> float:
    """Mean without the top and bottom 2%: keeps the hooks' periodic work, drops the preempted."""
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    return statistics.fmean(ordered[k : len(ordered) - k])


REFERENCE = ["--tp", "2", "--pp", "2", "--mbs", "2", "--accum", "2", "--quiet", "--steps", "14"]


def reference_overhead(pairs: int, warmup_steps: int = 4) -> dict[str, float]:
    """Median step time of the reference trainer with hooks on / off, runs alternated."""
    from trainer_hooks.reference.launch import read_metrics, run_gang

    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="sentinel-bench-hooks-") as tmp:
        data = Path(tmp) / "corpus"
        for i in range(2 * pairs):
            on = i % 2 == 0
            out = Path(tmp) / f"run{i}"
            env = {"SENTINEL_HOOKS_ENABLED": "1" if on else "0", "OMP_NUM_THREADS": "1"}
            run_gang(8, [*REFERENCE, "--out", str(out), "--data-dir", str(data)],
                     log_dir=out / "logs", timeout=600, env=env, fork=True)  # fmt: skip
            steps = read_metrics(out)[0]
            times[on] += [steps[s]["step_s"] for s in sorted(steps) if s > warmup_steps]
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {
        "reference_hook_overhead_ratio": round(on / off, 4),
        "reference_step_s_on": round(on, 4),
        "reference_step_s_off": round(off, 4),
        "reference_steps_each": len(times[True]),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--block", type=int, default=1, help="steps per on/off block")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="400 steps")
    p.add_argument("--no-reference", action="store_true", help="skip the reference-trainer runs")
    p.add_argument("--reference-pairs", type=int, default=2, help="on/off run pairs (default 2)")
    args = p.parse_args()
    if args.quick:
        args.steps = 400
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/times.json"
        mp.spawn(rank_main, args=(2, port, args, out), nprocs=2)
        data = json.loads(Path(out).read_text())
    on, off = statistics.median(data["on"]), statistics.median(data["off"])
    ratio = on / off
    mean_ratio = _trimmed_mean(data["on"]) / _trimmed_mean(data["off"])
    cpu_ratio = _trimmed_mean(data["cpu_on"]) / _trimmed_mean(data["cpu_off"])
    inside = statistics.fmean(data["inside"])  # every call, the periodic exchange included
    print(
        f"median step: hooks on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms ({len(data['on'])} each)"
    )
    reference = {} if args.no_reference else reference_overhead(args.reference_pairs)
    print(
        json.dumps(
            {
                **reference,
                "hook_overhead_ratio": round(ratio, 4),
                "trimmed_mean_ratio": round(mean_ratio, 4),
                "cpu_time_ratio": round(cpu_ratio, 4),
                "hook_calls_ms_per_step": round(inside * 1e3, 4),
                "hook_calls_ms_median": round(statistics.median(data["inside"]) * 1e3, 4),
                "hook_calls_ms_p90": round(
                    sorted(data["inside"])[int(0.9 * len(data["inside"]))] * 1e3, 4
                ),
                "hook_calls_ratio": round((off + inside) / off, 4),
                "step_ms_on": round(on * 1e3, 3),
                "step_ms_off": round(off * 1e3, 3),
                "steps_each": len(data["on"]),
                "hook_errors": data["errors"],
                "device": "cpu",
                "target": 1.01,
            }
        )
    )


if __name__ == "__main__":
    main()
