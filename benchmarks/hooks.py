"""hook_overhead_ratio: step time with every hook on / without hooks, same run, interleaved.

Two gloo ranks train a small MLP with an explicit gradient all-reduce (a plain DDP-style loop).
Steps alternate in blocks between the instrumented loop (step context, observe(loss,
grad_norm), wrapped collectives, step reports, the gang exchange every 20 steps, watchdog and
transport threads, an absent agent so events queue locally) and the bare loop; the ratio of the
median step times is reported for rank 0. Target <= 1.01 on CPU. Last line of output: JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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
    for step in range(args.steps):
        on = (step // args.block) % 2 == 0
        t0 = time.perf_counter()
        ctx = hooks.step(step, tokens=64) if on else contextlib.nullcontext()
        with ctx:
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat)
            grad_norm = flat.norm()
            if on:
                hooks.observe(loss=loss.detach(), grad_norm=grad_norm)
            opt.step()
            opt.zero_grad()
        if step >= args.warmup:
            times[on].append(time.perf_counter() - t0)
    hooks.close()
    if rank == 0:
        Path(out).write_text(
            json.dumps({"on": times[True], "off": times[False], "errors": hooks.errors})
        )
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="200 steps")
    args = p.parse_args()
    if args.quick:
        args.steps = 200
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
    print(
        f"median step: hooks on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms ({len(data['on'])} each)"
    )
    print(
        json.dumps(
            {
                "hook_overhead_ratio": round(ratio, 4),
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
