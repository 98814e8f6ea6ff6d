"""Build everything one rank trains with, from a config and an optional checkpoint to resume."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from trainer_hooks.reference.checkpoint import CheckpointManager
from trainer_hooks.reference.config import TrainConfig
from trainer_hooks.reference.data import BatchLoader, Corpus, write_corpus
from trainer_hooks.reference.engine import TrainStep
from trainer_hooks.reference.faults import FaultInjector
from trainer_hooks.reference.model import Transformer
from trainer_hooks.reference.optim import LRSchedule, build_optimizer
from trainer_hooks.reference.parallelize import build_mesh, build_schedule, build_stage_model


def device_and_backend() -> tuple[torch.device, str, torch.dtype | None]:
    """(device, process-group backend, autocast dtype for --dtype auto)."""
    if torch.cuda.is_available():
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        bf16 = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
        return dev, "cpu:gloo,cuda:nccl", bf16
    return torch.device("cpu"), "gloo", None


@dataclass
class Job:
    cfg: TrainConfig
    device: torch.device
    mesh: DeviceMesh
    model: Transformer
    opt: torch.optim.Optimizer
    lr: LRSchedule
    loader: BatchLoader
    ckpt: CheckpointManager
    injector: FaultInjector
    step_fn: TrainStep
    start: int = 0
    tokens: int = 0
    load_s: float = 0.0  # seconds the resume took to load its checkpoint
    skip: set[int] = field(default_factory=set)
    saves: int = 0

    @property
    def reports_loss(self) -> bool:
        """The rank whose loss counts: last pipeline stage, tp rank 0 (one per dp replica)."""
        return self.step_fn.last and self.mesh["tp"].get_local_rank() == 0

    def train_state(self, step: int) -> dict[str, Any]:
        return {
            "step": step,
            "tokens": self.tokens,
            "data": self.loader.state_dict(),
            "lr": self.lr.state_dict(),
            "skip": sorted(self.skip),
        }

    def save(self, step: int) -> dict[str, Any]:
        mode = self.cfg.checkpoint_mode
        sync = mode == "sync" or (mode == "alternate" and self.saves % 2 == 1)
        self.saves += 1
        wait_s, block_s = self.ckpt.save(
            step, self.model, self.opt, self.train_state(step), sync=sync
        )
        return {"checkpoint": step, "sync": sync, "wait_s": wait_s, "block_s": block_s}


def build_job(cfg: TrainConfig, resume: Path | None, faults: list[Any]) -> Job:
    device, _, auto_bf16 = device_and_backend()
    autocast = {"bf16": torch.bfloat16, "fp32": None, "auto": auto_bf16}[cfg.dtype]
    rank = dist.get_rank()
    mesh = build_mesh(device.type, cfg.pp, cfg.dp, cfg.tp)
    if rank == 0:
        write_corpus(cfg.data_dir, cfg.corpus)
    dist.barrier()
    torch.manual_seed(cfg.seed)  # every rank builds the same full model, then keeps its part
    model, _, _ = build_stage_model(Transformer(cfg.model), mesh, device, cfg.dp_mode)
    opt = build_optimizer(model, cfg.lr, cfg.weight_decay)
    loader = BatchLoader(
        Corpus(cfg.data_dir),
        seed=cfg.seed,
        seq=cfg.model.seq,
        mbs=cfg.mbs,
        accum=cfg.accum,
        dp=cfg.dp,
        dp_rank=mesh["dp"].get_local_rank(),
    )
    schedule = build_schedule(model, mesh, device, cfg.accum, cfg.schedule)
    job = Job(
        cfg=cfg,
        device=device,
        mesh=mesh,
        model=model,
        opt=opt,
        lr=LRSchedule(cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps),
        loader=loader,
        ckpt=CheckpointManager(cfg.ckpt_dir, cfg.durable_dir, cfg.keep, rank),
        injector=FaultInjector(faults, rank, cfg.out, cfg.model.vocab, device),
        step_fn=TrainStep(model, opt, mesh, schedule, cfg.accum, cfg.clip, autocast),
        skip=set(cfg.skip_batches),
    )
    if resume is not None:
        load_at = time.perf_counter()
        st = job.ckpt.load(resume, model, opt)
        job.load_s = time.perf_counter() - load_at
        job.start, job.tokens = st["step"], st["tokens"]
        loader.load_state_dict(st["data"])
        job.lr.load_state_dict(st["lr"])
        job.skip |= set(st["skip"])
    if cfg.lr_scale:
        first = job.start if cfg.lr_scale_from is None else cfg.lr_scale_from
        job.lr.scale_from(first, *cfg.lr_scale)
    loader.skip = frozenset(job.skip)
    job.ckpt.supersede_after(job.start)
    job.step_fn.before_update = job.ckpt.wait_staged
    return job
