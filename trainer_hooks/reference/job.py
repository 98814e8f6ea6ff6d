"""Build everything one rank trains with, from a config and an optional checkpoint to resume."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from sentinel.ranks.current import take_prepared
from trainer_hooks.reference.checkpoint import CheckpointManager
from trainer_hooks.reference.config import TrainConfig, model_of
from trainer_hooks.reference.data import BatchLoader, Corpus, write_corpus
from trainer_hooks.reference.engine import GangSync, TrainStep
from trainer_hooks.reference.faults import FaultInjector
from trainer_hooks.reference.ledger import LEDGER_DIR, Layout, LedgerWriter
from trainer_hooks.reference.model import ModelArgs, Transformer
from trainer_hooks.reference.optim import LRSchedule, build_optimizer
from trainer_hooks.reference.parallelize import build_mesh, build_schedules, build_stage_model

if TYPE_CHECKING:
    from trainer_hooks.reference.replicas import ReplicaLink


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
    ledger: LedgerWriter
    start: int = 0  # the step this launch started at (a resume's step)
    step: int = 0  # the next step to train (a replica that heals jumps to its peers' step)
    tokens: int = 0
    load_s: float = 0.0  # seconds the resume took to load its checkpoint
    skip: set[int] = field(default_factory=set)
    saves: int = 0
    link: ReplicaLink | None = None  # --replicas ft: this rank's link to the other replicas
    superseded: bool = False  # this launch set aside the checkpoints after its start

    @property
    def reports_loss(self) -> bool:
        """The rank whose loss counts: last pipeline stage, tp rank 0 (one per dp replica)."""
        return self.step_fn.last and self.mesh["tp"].get_local_rank() == 0

    @property
    def replica(self) -> int | None:
        return None if self.cfg.ft is None else self.cfg.ft.replica

    def tag(self, line: dict[str, Any]) -> dict[str, Any]:
        """A metrics line, with the replica that wrote it in the replica mode."""
        return line if self.replica is None else line | {"replica": self.replica}

    def train_state(self, step: int) -> dict[str, Any]:
        return {
            "step": step,
            "tokens": self.tokens,
            "data": self.loader.state_dict(),
            "lr": self.lr.state_dict(),
            "skip": sorted(self.skip),
            "ledger": self.ledger.head,
        }

    def restore(self, st: dict[str, Any]) -> None:
        """Take a train state (a checkpoint's, or a live peer's)."""
        self.step, self.tokens = st["step"], st["tokens"]
        self.loader.load_state_dict(st["data"])
        self.lr.load_state_dict(st["lr"])
        self.skip |= set(st["skip"])
        self.loader.skip = frozenset(self.skip)
        self.ledger.head = st.get("ledger")  # absent from checkpoints older than the ledger

    def replica_state(self) -> dict[str, Any]:
        """All a joining replica needs, sent by a live peer (see replicas.py)."""
        from trainer_hooks.reference.replicas import model_state

        return {"model": model_state(self.model, self.opt), "train": self.train_state(self.step)}

    def load_replica_state(self, state: dict[str, Any]) -> None:
        from trainer_hooks.reference.replicas import load_model_state

        load_model_state(self.model, self.opt, state["model"])
        self.restore(state["train"])

    def supersede_later_checkpoints(self) -> None:
        """Once a launch knows the step it trains from (`step`): set aside its checkpoints after
        it, the branch a rollback abandoned. A replica knows it after its first quorum: one
        that starts without a checkpoint may heal from a live peer there, and its checkpoints up
        to the peers' step are the job's own history, the newest ones a whole-job restart may
        need. (Set aside from step 0, a live repair in each replica could leave none: the next
        whole-job restart then trained from scratch, a wrong model with an exact ledger.)"""
        if not self.superseded:
            self.ckpt.supersede_after(self.step)
            self.superseded = True

    def committed(self, batch: int, quorum: int | None, assignment: dict[int, Any]) -> None:
        """The step trained on `batch` committed: move on and record it in the ledger."""
        self.ledger.record(self.step, batch, self.loader.jumped(batch), quorum, assignment)
        self.loader.take(batch)
        self.tokens += self.cfg.global_batch * self.cfg.model.seq
        self.step += 1

    def save(self, step: int) -> dict[str, Any]:
        mode = self.cfg.checkpoint_mode
        sync = mode == "sync" or (mode == "alternate" and self.saves % 2 == 1)
        self.saves += 1
        wait_s, block_s = self.ckpt.save(
            step, self.model, self.opt, self.train_state(step), sync=sync
        )
        return {"checkpoint": step, "sync": sync, "wait_s": wait_s, "block_s": block_s}

    def close(self) -> None:
        self.ledger.close()
        if self.link is not None:
            self.link.close()


def build_ledger(cfg: TrainConfig, rank: int) -> LedgerWriter:
    """Every rank keeps the chain's head; the gang's first rank writes the records."""
    name = "gang" if cfg.ft is None else f"replica-{cfg.ft.replica}"
    layout = Layout(cfg.microbatches, cfg.mbs, cfg.model.seq)
    path = cfg.out / LEDGER_DIR / f"{name}.jsonl"
    return LedgerWriter(path, layout, head=None, writer=name, write=rank == 0)


@dataclass(frozen=True)
class PreparedModel:
    """The full model built ahead of its generation (a warm rank process's idle time: a spare
    waiting for a rank), with the random state its construction left behind."""

    args: ModelArgs
    seed: int
    model: Transformer
    rng: torch.Tensor


def prepare_model(argv: list[str]) -> PreparedModel:
    args, seed = model_of(argv)
    torch.manual_seed(seed)
    model = Transformer(args)
    return PreparedModel(args, seed, model, torch.get_rng_state())


def full_model(cfg: TrainConfig) -> Transformer:
    """The full model from the seed: the one built ahead when it is this one (the random state
    then set as its construction left it, so nothing after can tell), else built now."""
    ready = take_prepared()
    if isinstance(ready, PreparedModel) and (ready.args, ready.seed) == (cfg.model, cfg.seed):
        torch.set_rng_state(ready.rng)
        return ready.model
    torch.manual_seed(cfg.seed)
    return Transformer(cfg.model)


def build_job(cfg: TrainConfig, resume: Path | None, faults: list[Any]) -> Job:
    device, _, auto_bf16 = device_and_backend()
    autocast = {"bf16": torch.bfloat16, "fp32": None, "auto": auto_bf16}[cfg.dtype]
    rank = dist.get_rank()
    # A replica of the fault-tolerant mode is a gang of its own: no dp inside it.
    mesh = build_mesh(device.type, cfg.pp, 1 if cfg.ft else cfg.dp, cfg.tp)
    if rank == 0:
        write_corpus(cfg.data_dir, cfg.corpus)
    dist.barrier()
    # every rank builds the same full model (or had it built ahead), then keeps its part
    model, _, _ = build_stage_model(full_model(cfg), mesh, device, cfg.dp_mode)
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
    # Faults name ranks of the whole job: replica R's rank r is R * tp * pp + r.
    job_rank = rank + (cfg.ft.replica * dist.get_world_size() if cfg.ft else 0)
    schedules = build_schedules(model, mesh, device, cfg.schedule)
    job = Job(
        cfg=cfg,
        device=device,
        mesh=mesh,
        model=model,
        opt=opt,
        lr=LRSchedule(cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps),
        loader=loader,
        ckpt=CheckpointManager(cfg.ckpt_dir, cfg.durable_dir, cfg.keep, rank),
        injector=FaultInjector(faults, job_rank, cfg.out, cfg.model.vocab, device),
        step_fn=TrainStep(model, opt, mesh, schedules, cfg.clip, autocast, GangSync(mesh)),
        ledger=build_ledger(cfg, rank),
        skip=set(cfg.skip_batches),
    )
    loader.skip = frozenset(job.skip)
    if resume is not None:
        load_at = time.perf_counter()
        st = job.ckpt.load(resume, model, opt)
        job.load_s = time.perf_counter() - load_at
        job.restore(st)
        job.start = job.step
    if cfg.lr_scale:
        first = job.start if cfg.lr_scale_from is None else cfg.lr_scale_from
        job.lr.scale_from(first, *cfg.lr_scale)
    if cfg.ft is None:  # a replica's waits for its first quorum (train_replica)
        job.supersede_later_checkpoints()
    job.step_fn.before_update = job.ckpt.wait_staged
    if cfg.ft is not None:
        from trainer_hooks.reference.replicas import ReplicaLink  # torchft: only in this mode

        job.link = ReplicaLink(cfg, device, job.replica_state, job.load_replica_state, job.step)
        job.step_fn.sync = job.link
    return job
