"""A small trainer for warm ranks: `python -m warm_trainer --steps N [--crash R:S] [--hang R:S]
[--fail R:S] [--out DIR]`, one gloo all_reduce per step, leaving when the supervisor asks.

Each step all-reduces (1, leave requested) over the gang, the way the reference trainer carries
its per-step flags, so every rank leaves after the same step. `--crash R:S`: rank R's process
dies (exit 3) at step S of generation 0; `--hang R:S`: rank R sleeps forever before step S's
collective; `--fail R:S`: rank R raises (a bug: the process lives on). Each rank appends
`generation rank pid step` lines to OUT/steps.txt. `--crash-on-leave R`: rank R's process dies
(exit 3) when the supervisor asks the gang to leave, a crash that coincides with a stop."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from sentinel.ranks.current import leave_requested


def _at(spec: str | None) -> tuple[int, int] | None:
    if spec is None:
        return None
    rank, step = spec.split(":")
    return int(rank), int(step)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--crash")
    p.add_argument("--hang")
    p.add_argument("--fail")
    p.add_argument("--crash-on-leave", type=int)
    p.add_argument("--out", type=Path)
    ns = p.parse_args(argv)
    generation = int(os.environ["SENTINEL_GENERATION"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        for step in range(ns.steps):
            first = generation == 0
            if first and _at(ns.crash) == (rank, step):
                os._exit(3)
            if first and _at(ns.hang) == (rank, step):
                while True:
                    time.sleep(3600)
            if first and _at(ns.fail) == (rank, step):
                raise RuntimeError("a bug in the training loop")
            if first and ns.crash_on_leave == rank and leave_requested():
                os._exit(3)
            flags = torch.tensor([1.0, float(leave_requested())])
            dist.all_reduce(flags)
            if ns.out is not None:
                with (ns.out / "steps.txt").open("a") as f:
                    f.write(f"{generation} {rank} {os.getpid()} {step}\n")
            if flags[1].item() > 0:  # the gang leaves after this step
                if first and ns.crash_on_leave == rank:
                    os._exit(3)  # it heard of the leave from a peer first: it dies instead
                return 0
            time.sleep(ns.step_s)
    finally:
        dist.destroy_process_group()
    return 0
