"""A plain data-parallel loop on a tiny model, instrumented with SentinelHooks, run as one rank.

Launched by the tests as real processes (gloo). Each step does `--compute-s` seconds of real
work: matrix products, a count measured once on rank 0 and the same on every rank. Faults are
injected here, in the rank's own work, and found by the hooks from their signals:
`--slow-rank R --slowdown F` gives rank R F times as many products (from step `--slow-from`),
`--spike-step S` / `--nan-step S` corrupt rank 0's loss, `--sdc-rank R` perturbs R's
arithmetic, `--stop-rank R --stop-step S` stops R before a collective (`--stop-in sub` before
the subgroup's, else the world's).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from trainer_hooks import HooksConfig, SentinelHooks, enable_flight_recorder


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--compute-s", type=float, default=0.01)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--spike-step", type=int, default=-1)
    p.add_argument("--nan-step", type=int, default=-1)
    p.add_argument("--sdc-rank", type=int, default=-1)
    p.add_argument("--sdc-every", type=int, default=0)
    p.add_argument("--stop-rank", type=int, default=-1)
    p.add_argument("--stop-step", type=int, default=-1)
    p.add_argument("--stop-in", choices=["world", "sub"], default="world")
    p.add_argument("--hang-floor-s", type=float, default=60.0)
    p.add_argument("--no-hooks", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse()
    enable_flight_recorder(200)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    sub_ranks = [world - 2, world - 1]
    sub = dist.new_group(sub_ranks)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = HooksConfig.from_env(
        enabled=not args.no_hooks,
        report_every=5,
        exchange_every=10,
        sdc_every=args.sdc_every,
        hang_floor_s=args.hang_floor_s,
        hang_first_step_s=max(args.hang_floor_s, 30.0),
        watchdog_poll_s=0.1,
    )
    hooks = SentinelHooks(cfg, model=model)
    if rank == args.sdc_rank:
        inject_sdc()
    gen = torch.Generator().manual_seed(1234 + rank)
    work = Work(args.compute_s)
    slowed = round(work.count * (args.slowdown if rank == args.slow_rank else 1.0))
    for step in range(args.steps):
        products = slowed if step >= args.slow_from else work.count
        with hooks.step(step, tokens=16):
            x = torch.randn(16, 32, generator=gen)
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            work.run(products)
            if rank == 0 and step == args.spike_step:
                loss = loss * 50
            if rank == 0 and step == args.nan_step:
                loss = loss * float("nan")
            maybe_stop(args, rank, step, "world")
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat)
            if rank in sub_ranks:
                maybe_stop(args, rank, step, "sub")
                dist.all_reduce(torch.ones(4), group=sub)
            offset = 0
            for p in model.parameters():
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p) / world)
                offset += p.numel()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            hooks.observe(loss=loss.detach(), grad_norm=grad_norm)
            opt.step()
            opt.zero_grad()
    hooks.close()
    print(f"rank {rank} done errors={hooks.errors}", flush=True)
    dist.destroy_process_group()


class Work:
    """A step's compute: 64x64 matrix products, as many as take `seconds` of CPU on rank 0."""

    def __init__(self, seconds: float) -> None:
        gen = torch.Generator().manual_seed(7)
        self.a, self.b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
        self.out = torch.empty(64, 64)
        t0 = time.thread_time()
        self.run(200)
        rate = torch.tensor([200 / max(time.thread_time() - t0, 1e-6)], dtype=torch.float64)
        dist.broadcast(rate, src=0)  # one count for the whole gang
        self.count = max(1, round(seconds * float(rate)))

    def run(self, products: int) -> None:
        for _ in range(products):
            torch.mm(self.a, self.b, out=self.out)


def maybe_stop(args: argparse.Namespace, rank: int, step: int, where: str) -> None:
    if rank == args.stop_rank and step == args.stop_step and args.stop_in == where:
        time.sleep(3600)


def inject_sdc() -> None:
    """A faulty ALU: every tanh result is off by one part in 10^6."""
    real = torch.tanh

    def faulty(x: torch.Tensor) -> torch.Tensor:
        return real(x) * (1 + 1e-6)

    torch.tanh = faulty  # type: ignore[assignment]


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
