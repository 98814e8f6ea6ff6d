"""Entry point: `python -m trainer_hooks.reference.train --out DIR [flags]`, one process per rank.

The step boundary is marked below: a hook added there sees `result.loss` and
`result.grad_norm` as tensors (no host sync needed) and the global loss as a float.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, TextIO

import torch
import torch.distributed as dist

from sentinel.exitcodes import InputError
from trainer_hooks import SentinelHooks, enable_flight_recorder
from trainer_hooks.reference.checkpoint import resolve_resume
from trainer_hooks.reference.config import ConfigError, TrainConfig, parse_config
from trainer_hooks.reference.digest import param_digest
from trainer_hooks.reference.faults import load_faults
from trainer_hooks.reference.instrument import build_hooks
from trainer_hooks.reference.job import Job, build_job, device_and_backend

_checkpoint_requested = False


def _request_checkpoint(_sig: int, _frame: object) -> None:
    global _checkpoint_requested
    _checkpoint_requested = True


def _emit(line: dict[str, Any], files: list[TextIO]) -> None:
    text = json.dumps(line)
    for f in files:
        print(text, file=f, flush=True)


def train_loop(job: Job, out: list[TextIO], hooks: SentinelHooks) -> None:
    global _checkpoint_requested
    cfg = job.cfg
    replica_tokens = cfg.mbs * cfg.accum * cfg.model.seq  # what this rank's replica processes
    for step in range(job.start, cfg.steps):
        t0 = time.perf_counter()
        hooks.begin_step(step, tokens=replica_tokens)
        job.injector.before_step(step)
        batch, toks = job.loader.next()
        toks = job.injector.corrupt_batch(batch, toks).to(job.device)
        lr = job.lr.apply(job.opt, step)
        result = job.step_fn(toks)
        hooks.observe(loss=result.loss if job.step_fn.last else None, grad_norm=result.grad_norm)
        mine = result.loss / cfg.dp if job.reports_loss and result.loss is not None else 0.0
        flags = [float(mine), float(_checkpoint_requested)]
        stats = torch.tensor(flags, dtype=torch.float64, device=job.device)
        dist.all_reduce(stats)  # the global loss on every rank, and "a rank got SIGUSR1"
        job.tokens += cfg.global_batch * cfg.model.seq
        step_s = time.perf_counter() - t0
        job.injector.after_step(step_s)
        hooks.end_step()
        done = step + 1
        # ---- step boundary: result.loss, result.grad_norm (tensors), stats[0] (global loss) ----
        line = {"step": done, "loss": stats[0].item(), "lr": lr, "batch": batch}
        line |= {"grad_norm": result.grad_norm.item(), "tokens": job.tokens, "step_s": step_s}
        stall = job.ckpt.take_stall()  # this step's wait for the last save's staging copy
        _emit(line if stall is None else line | {"ckpt_stall_s": stall}, out)
        job.ckpt.poll()
        on_command = (
            hooks.should_checkpoint()
        )  # a coordinator `checkpoint.now`, same step everywhere
        if (
            (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)
            or stats[1].item() > 0
            or on_command
        ):
            _checkpoint_requested = False
            _emit(job.save(done), out)


def train(cfg: TrainConfig, resume: Any, faults: list[Any]) -> None:
    job = build_job(cfg, resume, faults)
    out: list[TextIO] = []
    if dist.get_rank() == 0:
        cfg.out.mkdir(parents=True, exist_ok=True)
        out = [(cfg.out / "metrics.jsonl").open("a")] + ([] if cfg.quiet else [sys.stdout])
    hooks = build_hooks(job)
    try:
        train_loop(job, out, hooks)
    finally:
        hooks.close()
    job.ckpt.finish()
    digest = param_digest(job.model, job.mesh)
    _emit({"final_step": cfg.steps, "digest": digest, "tokens": job.tokens}, out)
    if out and cfg.digest_out:
        cfg.digest_out.write_text(digest + "\n")


def main(argv: list[str] | None = None) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg = parse_config(argv, world)
        faults = load_faults(cfg.fault_file, cfg.fault_flags)
        tiers = [cfg.ckpt_dir] + ([cfg.durable_dir] if cfg.durable_dir else [])
        resume = resolve_resume(cfg.resume_from, tiers) if cfg.resume_from else None
    except (ConfigError, InputError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, default)
    os.environ.setdefault("MASTER_PORT", "29511")
    signal.signal(signal.SIGUSR1, _request_checkpoint)
    enable_flight_recorder()  # PyTorch's own recorder, before the process group exists
    if not torch.cuda.is_available():
        # On CPU the intra-op thread count changes reduction order: it is part of the numerical
        # program, so the trainer pins it itself, whoever launched it (torchrun, sentinel run).
        torch.set_num_threads(cfg.cpu_threads)
    dist.init_process_group(device_and_backend()[1])
    try:
        train(cfg, resume, faults)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
