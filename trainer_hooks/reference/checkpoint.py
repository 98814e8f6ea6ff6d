"""Atomic, two-tier, asynchronous checkpoints with torch.distributed.checkpoint (DCP).

Layout of one checkpoint, `<tier>/step-00000040/`:
  DCP files + .metadata     model and optimizer (get_state_dict: resharding by FQN)
  train_state.json          step, tokens seen, data position, LR scale window, skip list
  rng/rank-R.pt             each rank's CPU/accelerator/numpy/python RNG states
  COMMITTED                 written last, by rank 0, once every rank's write has finished

A directory without COMMITTED is torn (a crash mid-write) and ignored. Training blocks only
while `dcp.async_save` stages a copy of the state; the write, the commit, the copy to the
durable tier and the pruning to the last K happen while training goes on.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.tensor import DTensor

COMMITTED = "COMMITTED"
TRAIN_STATE = "train_state.json"
PREFIX = "step-"
# Optimizer state keyed by parameter FQN, not by param-group index: pipeline stages hold
# different groups' contents, and a stage must load its own.
SD_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def step_dir(tier: Path, step: int) -> Path:
    return tier / f"{PREFIX}{step:08d}"


def step_of(d: Path) -> int | None:
    tail = d.name[len(PREFIX) :]
    return int(tail) if d.name.startswith(PREFIX) and tail.isdigit() else None


def committed_steps(tier: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints in a tier, oldest first."""
    if not tier.is_dir():
        return []
    out = []
    for d in tier.iterdir():
        step = step_of(d)
        if step is not None and (d / COMMITTED).exists():
            out.append((step, d))
    return sorted(out)


def resolve_resume(spec: str, tiers: list[Path]) -> Path | None:
    """`latest` -> the newest committed checkpoint in any tier (fast tier wins a tie), or a dir."""
    if spec == "latest":
        best: tuple[int, int, Path] | None = None
        for prio, tier in enumerate(tiers):
            for step, d in committed_steps(tier):
                if best is None or (step, -prio) > (best[0], best[1]):
                    best = (step, -prio, d)
        return best[2] if best else None
    d = Path(spec)
    if not (d / COMMITTED).exists():
        raise FileNotFoundError(f"{d} is not a committed checkpoint (no {COMMITTED} marker)")
    return d


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


class _ReusedBufferStager(AsyncStager):
    """Copies the state into reused CPU buffers on a background thread.

    DCP's default stager deep-copies into fresh memory, on the training thread, on every save.
    Here the copy runs while the next step's forward and backward run (they read the
    parameters and optimizer state but do not change them); the trainer waits for it only
    before its next optimizer step (`CheckpointManager.wait_staged`). Buffers are allocated on
    the first save and reused: a new save starts only after the previous write finished.
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._buffers: Any = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-stage")

    def _stage_now(self, state_dict: Any) -> Any:
        if self._buffers is None:
            self._buffers = _clone_tree(state_dict)
        else:
            self._buffers = _copy_tree(state_dict, self._buffers)
        return self._buffers

    def stage(self, state_dict: Any, **_: Any) -> Future[Any]:
        return self._pool.submit(self._stage_now, state_dict)

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


def _clone_tree(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_clone_tree(v) for v in x)
    return copy.deepcopy(x)


def _copy_tree(src: Any, dst: Any) -> Any:
    if isinstance(src, torch.Tensor):
        if not isinstance(dst, torch.Tensor) or dst.shape != src.shape or dst.dtype != src.dtype:
            return _clone_tree(src)
        if isinstance(src, DTensor) and isinstance(dst, DTensor):
            dst.to_local().copy_(src.to_local())
        else:
            dst.copy_(src.detach())
        return dst
    if isinstance(src, dict) and isinstance(dst, dict):
        return {k: _copy_tree(v, dst[k]) if k in dst else _clone_tree(v) for k, v in src.items()}
    return _clone_tree(src)


@dataclass
class _Pending:
    step: int
    path: Path
    future: Future[Any] | None
    blocked_s: float = 0.0  # training time this save held up so far


# Told (step, seconds the save held up training, its directory) once a checkpoint is committed.
OnCommit = Callable[[int, float, Path], None]


class CheckpointManager:
    """One per rank. All ranks call save/poll/finish at the same step boundaries."""

    def __init__(self, local: Path, durable: Path | None, keep: int, rank: int) -> None:
        self.local, self.durable, self.keep, self.rank = local, durable, keep, rank
        # A dedicated gloo group: the background write's collectives never interleave with
        # training collectives on the default group.
        self.pg = dist.new_group(backend="gloo")
        self._pending: _Pending | None = None
        self._copier: threading.Thread | None = None
        self._stager = _ReusedBufferStager()
        self._staging: Future[None] | None = None
        self._stall_s: float | None = None
        # Called on rank 0 once COMMITTED is written: only then can a restart resume from it.
        self.on_commit: OnCommit | None = None

    def tiers(self) -> list[Path]:
        return [self.local] + ([self.durable] if self.durable else [])

    def supersede_after(self, step: int) -> None:
        """Before training from `step`: torn dirs are deleted, later committed ones set aside."""
        if self.rank == 0:
            for tier in self.tiers():
                if not tier.is_dir():
                    continue
                for d in sorted(tier.glob(f"{PREFIX}*")):
                    d_step = step_of(d)
                    later = d_step is None or d_step > step
                    if not (d / COMMITTED).exists():
                        shutil.rmtree(d, ignore_errors=True)
                    elif later:
                        aside = tier / "superseded"
                        aside.mkdir(exist_ok=True)
                        d.rename(aside / f"{d.name}.{os.getpid()}")
        dist.barrier(group=self.pg)

    def save(
        self,
        step: int,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        train_state: dict[str, Any],
        *,
        sync: bool = False,
    ) -> tuple[float, float]:
        """Start a save; (seconds waiting for the previous save, seconds this one blocked)."""
        t0 = time.perf_counter()
        self.finish()
        t1 = time.perf_counter()
        path = step_dir(self.local, step)
        (path / "rng").mkdir(parents=True, exist_ok=True)
        torch.save(rng_state(), path / "rng" / f"rank-{self.rank}.pt")
        if self.rank == 0:
            _write_atomic(path / TRAIN_STATE, json.dumps(train_state, sort_keys=True))
        model_sd, optim_sd = get_state_dict(model, opt, options=SD_OPTIONS)
        state = {"model": model_sd, "optim": optim_sd}
        if sync:
            dcp.save(state, checkpoint_id=str(path), process_group=self.pg)
            self._pending = _Pending(step, path, None, time.perf_counter() - t0)
            self._commit()
        else:
            resp = dcp.async_save(
                state, checkpoint_id=str(path), process_group=self.pg, async_stager=self._stager
            )
            assert isinstance(resp, AsyncSaveResponse), "a Future-returning stager gives both"
            self._staging = resp.staging_completion
            blocked = time.perf_counter() - t0
            self._pending = _Pending(step, path, resp.upload_completion, blocked)
        return t1 - t0, time.perf_counter() - t1

    def wait_staged(self) -> None:
        """Before an optimizer step: the in-flight save must have copied the state it saves."""
        if self._staging is not None:
            t0 = time.perf_counter()
            self._staging.result()
            self._staging = None
            stall = time.perf_counter() - t0
            self._stall_s = (self._stall_s or 0.0) + stall
            if self._pending is not None:
                self._pending.blocked_s += stall

    def take_stall(self) -> float | None:
        """Seconds the last step waited for staging (None when it did not wait)."""
        stall, self._stall_s = self._stall_s, None
        return stall

    def poll(self) -> None:
        """At a step boundary: commit the in-flight save if its write has finished."""
        p = self._pending
        if p is not None and p.future is not None and p.future.done():
            self._commit()

    def finish(self) -> None:
        """Wait for the in-flight save and the durable copy (before a new save and at exit)."""
        self.wait_staged()
        if self._pending is not None:
            self._commit()
        if self._copier is not None:
            self._copier.join()
            self._copier = None

    def _commit(self) -> None:
        p = self._pending
        assert p is not None
        self._pending = None
        if p.future is not None:
            p.future.result()
        if self.rank != 0:
            return
        # Rank 0's save returns only after every rank's write landed and .metadata was written.
        _write_atomic(p.path / COMMITTED, json.dumps({"step": p.step}))
        if self.on_commit is not None:
            self.on_commit(p.step, p.blocked_s, p.path)
        if self._copier is not None:
            self._copier.join()
        if self.durable is not None:
            self._copier = threading.Thread(
                target=self._copy_durable, args=(p.path,), name="ckpt-durable", daemon=True
            )
            self._copier.start()
        self._prune(self.local)

    def _copy_durable(self, src: Path) -> None:
        assert self.durable is not None
        self.durable.mkdir(parents=True, exist_ok=True)
        dst = self.durable / src.name
        tmp = self.durable / f".{src.name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(COMMITTED))
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
        _write_atomic(dst / COMMITTED, (src / COMMITTED).read_text())
        self._prune(self.durable)

    def _prune(self, tier: Path) -> None:
        for _, d in committed_steps(tier)[: -self.keep]:
            shutil.rmtree(d, ignore_errors=True)

    def load(self, path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
        """Restore model, optimizer and this rank's RNG; return the train state."""
        model_sd, optim_sd = get_state_dict(model, opt, options=SD_OPTIONS)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path), process_group=self.pg)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rng_file = path / "rng" / f"rank-{self.rank}.pt"
        if rng_file.exists():  # absent when resuming with more ranks than were saved
            set_rng_state(torch.load(rng_file, weights_only=False))
        return dict(json.loads((path / TRAIN_STATE).read_text()))
