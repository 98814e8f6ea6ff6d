"""hook_overhead_ratio: the reference trainer's time per step with every hook on / without.

The reference trainer (TP2 x PP2 x DP2, 8 gloo ranks, the demo configuration) runs in pairs of
whole runs, hooks on and off, each pair in a random order. Each rank times its own window of
`--reference-steps` steps after `--reference-warmup` untimed ones: wall time (everything in the
window, the hooks' periodic exchange and SDC checks included) and its process's CPU time (all
threads). `hook_overhead_ratio` is the median over pairs of on/off wall time per step;
`hook_overhead_cpu_ratio` the same with the whole gang's CPU time per step, which other tenants
of a shared machine disturb less; the per-pair ratios are listed. "On" is a supervised run:
events to an agent socket (a sink process), flight recorder on with a dump directory, the gang
exchange every 20 steps, an SDC check every 40. "Off" is the bare trainer: hooks disabled and
no flight recorder. Skip it with `--no-reference`.

The toy loop: two gloo ranks train a small MLP with an explicit gradient all-reduce, steps
alternating (pairs of one-step blocks, each pair in a random order) between the instrumented
loop and the bare one. Reported for rank 0: `toy_hook_overhead_ratio` (median step times),
`trimmed_mean_ratio` (counts the periodic work), `cpu_time_ratio` (the process's CPU time per
step), and `hook_calls_ratio`, (bare step + mean time inside the hooks' calls) / bare step.
Target <= 1.01 on CPU. Last line of output: JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


# --- the reference trainer: whole runs, hooks on vs off ----------------------------------------

REFERENCE = ["--tp", "2", "--pp", "2", "--mbs", "2", "--accum", "2", "--quiet"]
EXCHANGE_EVERY = 20  # the hooks' default: straggler scores and requests every 20 steps
SDC_EVERY = 40  # a matmul + parameter SDC check every 40 steps: far more often than a real run

# The agent's side of the socket: accept every rank, read and count event batches (lines).
SINK = """
import selectors, socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(64)
sel = selectors.DefaultSelector()
sel.register(srv, selectors.EVENT_READ); sel.register(sys.stdin, selectors.EVENT_READ)
lines = 0
while True:
    for key, _ in sel.select():
        if key.fileobj is srv:
            sel.register(srv.accept()[0], selectors.EVENT_READ)
        elif key.fileobj is sys.stdin:
            if not sys.stdin.readline():
                print(lines, flush=True); sys.exit(0)
        else:
            data = key.fileobj.recv(65536)
            if not data:
                sel.unregister(key.fileobj); key.fileobj.close()
            lines += data.count(b"\\n")
"""


def timed_rank(argv: list[str]) -> int:
    """A reference-trainer rank that measures its own timed window: the real `train_loop` runs
    the warm-up steps, then the timed steps; the window's wall time and this process's CPU time
    (every thread: the trainer's, gloo's and the hooks') go to OUT/window-<rank>.json."""
    from trainer_hooks.reference import train

    warmup = int(os.environ["SENTINEL_BENCH_WARMUP"])
    real_loop = train.train_loop

    def loop(job: Any, out: Any, hooks: SentinelHooks) -> None:
        cfg = job.cfg
        job.cfg = dataclasses.replace(cfg, steps=warmup)
        real_loop(job, out, hooks)
        job.cfg, job.start = cfg, warmup
        wall0, cpu0 = time.perf_counter(), time.process_time()
        real_loop(job, out, hooks)
        window = {
            "wall_s": time.perf_counter() - wall0,
            "cpu_s": time.process_time() - cpu0,
            "steps": cfg.steps - warmup,
            "hook_errors": hooks.errors,
        }
        (cfg.out / f"window-{dist.get_rank()}.json").write_text(json.dumps(window))

    train.train_loop = loop
    return train.main(argv)


def reference_run(on: bool, tmp: Path, name: str, steps: int, warmup: int, sock: str) -> dict:
    """One whole run of the 8-rank reference trainer; its timed window per step."""
    from trainer_hooks.reference.launch import run_gang

    out = tmp / name
    env = dict(os.environ, OMP_NUM_THREADS="1", SENTINEL_BENCH_WARMUP=str(warmup))
    if on:  # every hook, as in a supervised run: events to the agent, recorder dumps, SDC checks
        env.update(
            SENTINEL_AGENT_SOCKET=sock,
            SENTINEL_JOB="bench",
            SENTINEL_HOOKS_FR_DIR=str(out / "fr"),
            SENTINEL_HOOKS_EXCHANGE_EVERY=str(EXCHANGE_EVERY),
            SENTINEL_HOOKS_SDC_EVERY=str(SDC_EVERY),
            TORCH_FR_BUFFER_SIZE="2000",
        )
    else:  # the bare trainer: no hooks, and no flight recorder either
        env.update(SENTINEL_HOOKS_ENABLED="0", TORCH_FR_BUFFER_SIZE="0")
    args = [*REFERENCE, "--steps", str(warmup + steps), "--out", str(out)]
    args += ["--data-dir", str(tmp / "corpus")]
    run_gang(8, args, log_dir=out / "logs", timeout=900, env=env, fork=True, entry=timed_rank)
    windows = [json.loads((out / f"window-{r}.json").read_text()) for r in range(8)]
    return {
        "step_s": statistics.median(w["wall_s"] for w in windows) / steps,
        "cpu_s": sum(w["cpu_s"] for w in windows) / steps,  # the whole gang's CPU per step
        "hook_errors": sum(w["hook_errors"] for w in windows),
    }


def reference_overhead(pairs: int, steps: int, warmup: int, seed: int = 0) -> dict[str, Any]:
    """Pairs of whole runs, hooks on and off, each pair in a random order; per-pair ratios of
    the timed windows' wall time and the gang's CPU time per step, and their medians."""
    rng = random.Random(seed)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="sentinel-bench-hooks-") as tmp_name:
        tmp = Path(tmp_name)
        sock = str(tmp / "agent.sock")
        sink = subprocess.Popen(
            [sys.executable, "-c", SINK, sock],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            for i in range(pairs):
                first = rng.random() < 0.5
                for on in (first, not first):
                    name = f"pair{i}-{'on' if on else 'off'}"
                    runs[on].append(reference_run(on, tmp, name, steps, warmup, sock))
                    r = runs[on][-1]
                    print(
                        f"reference {name}: {r['step_s'] * 1e3:.1f} ms/step, gang CPU "
                        f"{r['cpu_s'] * 1e3:.1f} ms/step, load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
        finally:
            batches, _ = sink.communicate("", timeout=30)
    wall = [a["step_s"] / b["step_s"] for a, b in zip(runs[True], runs[False], strict=True)]
    cpu = [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[True], runs[False], strict=True)]

    def med(arm: bool, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[arm]), 4)

    return {
        "hook_overhead_ratio": round(statistics.median(wall), 4),
        "hook_overhead_cpu_ratio": round(statistics.median(cpu), 4),
        "reference_hook_overhead_ratio": round(statistics.median(wall), 4),
        "reference_pair_ratios": [round(r, 4) for r in wall],
        "reference_pair_cpu_ratios": [round(r, 4) for r in cpu],
        "reference_step_s_on": med(True, "step_s"),
        "reference_step_s_off": med(False, "step_s"),
        "reference_cpu_s_per_step_on": med(True, "cpu_s"),
        "reference_cpu_s_per_step_off": med(False, "cpu_s"),
        "reference_steps_each": steps * pairs,
        "reference_warmup_steps": warmup,
        "reference_pairs": pairs,
        "reference_agent_batches": int(batches.strip() or 0),
        "reference_hook_errors": sum(r["hook_errors"] for r in runs[True]),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1200, help="toy-loop steps")
    p.add_argument("--block", type=int, default=1, help="toy-loop steps per on/off block")
    p.add_argument("--warmup", type=int, default=20, help="toy-loop warm-up steps")
    p.add_argument("--quick", action="store_true", help="400 toy steps, 3 reference pairs of 40")
    p.add_argument("--no-reference", action="store_true", help="skip the reference-trainer runs")
    p.add_argument("--reference-pairs", type=int, default=None, help="on/off run pairs (6)")
    p.add_argument("--reference-steps", type=int, default=None, help="timed steps per run (80)")
    p.add_argument("--reference-warmup", type=int, default=5, help="untimed steps per run")
    args = p.parse_args()
    quick = args.quick
    if quick:
        args.steps = 400
    pairs = args.reference_pairs or (3 if quick else 6)
    ref_steps = args.reference_steps or (40 if quick else 80)
    if pairs < 1 or ref_steps < 1 or args.reference_warmup < 1:
        p.error("--reference-pairs, --reference-steps and --reference-warmup must be >= 1")
    load_start = os.getloadavg()
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
        f"toy median step: hooks on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms "
        f"({len(data['on'])} each)",
        flush=True,
    )
    reference = (
        {} if args.no_reference else reference_overhead(pairs, ref_steps, args.reference_warmup)
    )
    print(
        json.dumps(
            {
                **reference,
                "toy_hook_overhead_ratio": round(ratio, 4),
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
                "load_avg_start": round(load_start[0], 2),
                "load_avg_end": round(os.getloadavg()[0], 2),
                "device": "cpu",
                "target": 1.01,
            }
        )
    )


if __name__ == "__main__":
    main()
