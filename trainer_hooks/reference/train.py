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
from trainer_hooks.reference.checkpoint import CheckpointManager, resolve_resume
from trainer_hooks.reference.config import ConfigError, TrainConfig, parse_config
from trainer_hooks.reference.data import BatchLoader, Corpus, write_corpus
from trainer_hooks.reference.digest import param_digest
from trainer_hooks.reference.engine import TrainStep
from trainer_hooks.reference.faults import FaultInjector, load_faults
from trainer_hooks.reference.model import Transformer
from trainer_hooks.reference.optim import LRSchedule, build_optimizer
from trainer_hooks.reference.parallelize import build_mesh, build_schedule, build_stage_model

_checkpoint_requested = False


def _request_checkpoint(_sig: int, _frame: object) -> None:
    global _checkpoint_requested
    _checkpoint_requested = True


def _device() -> tuple[torch.device, str, torch.dtype | None]:
    if torch.cuda.is_available():
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        bf16 = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        return dev, "cpu:gloo,cuda:nccl", bf16
    return torch.device("cpu"), "gloo", None


def _emit(line: dict[str, Any], files: list[TextIO]) -> None:
    text = json.dumps(line)
    for f in files:
        print(text, file=f, flush=True)


def train(cfg: TrainConfig, resume: Any, faults: list[Any]) -> None:
    device, _, auto_bf16 = _device()
    rank = dist.get_rank()
    autocast = torch.bfloat16 if cfg.dtype == "bf16" else auto_bf16 if cfg.dtype == "auto" else None
    mesh = build_mesh(device.type, cfg.pp, cfg.dp, cfg.tp)
    if rank == 0:
        write_corpus(cfg.data_dir, cfg.corpus)
    dist.barrier()
    torch.manual_seed(cfg.seed)  # every rank builds the same full model, then keeps its part
    model, _, _ = build_stage_model(Transformer(cfg.model), mesh, device)
    opt = build_optimizer(model, cfg.lr, cfg.weight_decay)
    lr = LRSchedule(cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
    dp_rank = mesh["dp"].get_local_rank()
    loader = BatchLoader(
        Corpus(cfg.data_dir),
        seed=cfg.seed,
        seq=cfg.model.seq,
        mbs=cfg.mbs,
        accum=cfg.accum,
        dp=cfg.dp,
        dp_rank=dp_rank,
    )
    ckpt = CheckpointManager(cfg.ckpt_dir, cfg.durable_dir, cfg.keep, rank)
    start, tokens, skip = 0, 0, set(cfg.skip_batches)
    if resume is not None:
        st = ckpt.load(resume, model, opt)
        start, tokens = st["step"], st["tokens"]
        loader.load_state_dict(st["data"])
        lr.load_state_dict(st["lr"])
        skip |= set(st["skip"])
    if cfg.lr_scale:
        lr.scale_from(start, *cfg.lr_scale)
    loader.skip = frozenset(skip)
    ckpt.supersede_after(start)
    injector = FaultInjector(faults, rank, cfg.out, cfg.model.vocab)
    injector.install_sdc(model)
    step_fn = TrainStep(
        model,
        opt,
        mesh,
        build_schedule(model, mesh, device, cfg.accum, cfg.schedule),
        cfg.accum,
        cfg.clip,
        autocast,
    )
    reports_loss = step_fn.last and mesh["tp"].get_local_rank() == 0
    out: list[TextIO] = []
    if rank == 0:
        cfg.out.mkdir(parents=True, exist_ok=True)
        out = [(cfg.out / "metrics.jsonl").open("a")] + ([] if cfg.quiet else [sys.stdout])
    global _checkpoint_requested
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        injector.before_step(step)
        batch, toks = loader.next()
        toks = injector.corrupt_batch(batch, toks).to(device)
        step_lr = lr.apply(opt, step)
        result = step_fn(toks)
        mine = result.loss / cfg.dp if reports_loss and result.loss is not None else 0.0
        stats = torch.tensor(
            [float(mine), float(_checkpoint_requested)], dtype=torch.float64, device=device
        )
        dist.all_reduce(stats)  # global loss on every rank + "someone asked for a checkpoint"
        tokens += cfg.global_batch * cfg.model.seq
        step_s = time.perf_counter() - t0
        injector.after_step(step_s)
        done = step + 1
        # ---- step boundary: result.loss, result.grad_norm (tensors), stats[0] (global loss) ----
        _emit(
            {
                "step": done,
                "loss": stats[0].item(),
                "lr": step_lr,
                "batch": batch,
                "grad_norm": result.grad_norm.item(),
                "tokens": tokens,
                "step_s": step_s,
            },
            out,
        )
        ckpt.poll()
        if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or stats[1].item() > 0:
            _checkpoint_requested = False
            state = {
                "step": done,
                "tokens": tokens,
                "data": loader.state_dict(),
                "lr": lr.state_dict(),
                "skip": sorted(skip),
            }
            ckpt.save(done, model, opt, state, sync=cfg.sync_checkpoint)
    ckpt.finish()
    digest = param_digest(model, mesh)
    if rank == 0:
        _emit({"final_step": cfg.steps, "digest": digest, "tokens": tokens}, out)
        if cfg.digest_out:
            cfg.digest_out.write_text(digest + "\n")


def main(argv: list[str] | None = None) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg = parse_config(argv, world)
        faults = load_faults(cfg.fault_file, cfg.fault_flags)
        resume = (
            resolve_resume(
                cfg.resume_from, [cfg.ckpt_dir] + ([cfg.durable_dir] if cfg.durable_dir else [])
            )
            if cfg.resume_from
            else None
        )
    except (ConfigError, InputError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    signal.signal(signal.SIGUSR1, _request_checkpoint)
    dist.init_process_group(_device()[1])
    try:
        train(cfg, resume, faults)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
