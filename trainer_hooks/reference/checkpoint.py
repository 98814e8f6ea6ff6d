"""Atomic, two-tier, asynchronous checkpoints with torch.distributed.checkpoint (DCP).

Layout of one checkpoint, `<tier>/step-00000040/`:
  DCP files + .metadata     model and optimizer (get_state_dict: resharding by FQN)
  train_state.json          step, tokens seen, data position, LR scale window, skip list
  rng/rank-R.pt             each rank's CPU/accelerator/numpy/python RNG states
  COMMITTED                 written last, by rank 0, once every rank's write has finished

A directory without COMMITTED is torn (a crash mid-write) and ignored. Training blocks only
while `dcp.async_save` stages a copy of the state; the write, the commit, the copy to the
durable tier and the pruning to the last K happen while training goes on.

The fast tier may be one directory every node sees (one machine, or a shared filesystem) or a
node-local disk (the same path on every node, or a path with `{node}` in it). Which one it is
is probed when the gang starts (`TierLayout`). On node-local disks each node holds only its own
ranks' files, and DCP reads across ranks (a data-parallel replica is written once, by one rank),
so no node can resume from its own copy alone: there every node's first rank copies the node's
files into the durable tier in the background and marks its part done; rank 0 commits the
durable checkpoint once every node's part is there. A node-local step directory gets NODE_DONE,
never COMMITTED, so a resume reads the durable tier.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import socket
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
NODE_DONE = "NODE_DONE"  # a node-local fast tier: this node's part of the checkpoint is written
COPIED = ".copied"  # in a durable checkpoint being assembled: one marker per node copied
# How long rank 0 waits for the other nodes' copies before it gives the checkpoint up (a node
# that died mid-copy): the durable tier then keeps its previous checkpoint.
NODE_COPY_TIMEOUT_S = 1800.0
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


def committed_steps(tier: Path, marker: str = COMMITTED) -> list[tuple[int, Path]]:
    """Committed checkpoints in a tier (or, with NODE_DONE, a node's finished parts), oldest
    first."""
    if not tier.is_dir():
        return []
    out = []
    for d in tier.iterdir():
        step = step_of(d)
        if step is not None and (d / marker).exists():
            out.append((step, d))
    return sorted(out)


class TierError(ValueError):
    """The checkpoint tiers cannot work as given (every rank finds the same, at start-up)."""


def this_node() -> str:
    """The node this rank runs on: the launcher's SENTINEL_NODE, else the host name."""
    return os.environ.get("SENTINEL_NODE") or socket.gethostname()


def expand_node(path: Path, node: str) -> Path:
    """`{node}` in a fast-tier path names this rank's node (one directory per node)."""
    return Path(str(path).replace("{node}", node)) if "{node}" in str(path) else path


@dataclass(frozen=True)
class TierLayout:
    """Where the gang's nodes are and whether they share the fast tier."""

    node: str
    nodes: tuple[str, ...]  # distinct, in rank order
    leader: bool  # this rank is its node's first: it marks, copies and prunes the node's part
    shared: bool  # every node sees the same fast-tier directory

    @classmethod
    def probe(cls, local: Path, node: str, pg: dist.ProcessGroup) -> TierLayout:
        """Each node's first rank leaves a file in the fast tier; rank 0 sees all of them only
        if the tier is shared."""
        names: list[Any] = [None] * dist.get_world_size(pg)
        dist.all_gather_object(names, node, group=pg)
        nodes = tuple(dict.fromkeys(names))
        leader = names.index(node) == dist.get_rank(pg)
        if len(nodes) == 1:
            return cls(node, nodes, leader, shared=True)
        probes = local / ".nodes"
        if leader:
            probes.mkdir(parents=True, exist_ok=True)
            (probes / node).touch()
        dist.barrier(group=pg)
        verdict = [all((probes / n).exists() for n in nodes)]
        dist.broadcast_object_list(verdict, src=0, group=pg)
        dist.barrier(group=pg)
        if leader:
            (probes / node).unlink(missing_ok=True)
        return cls(node, nodes, leader, shared=bool(verdict[0]))


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


def _supersede(tier: Path, step: int, marker: str) -> None:
    """Delete a tier's torn step directories (no `marker`); set aside those after `step`."""
    if not tier.is_dir():
        return
    for d in sorted(tier.glob(f"{PREFIX}*")):
        d_step = step_of(d)
        if not (d / marker).exists():
            shutil.rmtree(d, ignore_errors=True)
        elif d_step is None or d_step > step:
            aside = tier / "superseded"
            aside.mkdir(exist_ok=True)
            # One process may set the same step aside more than once (a warm rank process runs
            # one generation after another): the name is unique by time, not only by pid.
            d.rename(aside / f"{d.name}.{os.getpid()}.{time.time_ns()}")


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

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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

    def __init__(
        self, local: Path, durable: Path | None, keep: int, rank: int, node: str | None = None
    ) -> None:
        node = node or this_node()
        self.local, self.durable, self.keep, self.rank = (
            expand_node(local, node),
            durable,
            keep,
            rank,
        )
        # A dedicated gloo group: the background write's collectives never interleave with
        # training collectives on the default group.
        self.pg = dist.new_group(backend="gloo")
        self.layout = TierLayout.probe(self.local, node, self.pg)
        if not self.layout.shared and durable is None:
            raise TierError(
                f"the fast tier {local} is node-local (nodes {', '.join(self.layout.nodes)} do "
                "not share it): a resume needs every node's part, so give a --durable-dir"
            )
        self._pending: _Pending | None = None
        self._copier: threading.Thread | None = None
        self._stager = _ReusedBufferStager()
        self._staging: Future[None] | None = None
        self._stall_s: float | None = None
        # Called on rank 0 once COMMITTED is written: only then can a restart resume from it.
        self.on_commit: OnCommit | None = None

    def tiers(self) -> list[Path]:
        return [self.local] + ([self.durable] if self.durable else [])

    @property
    def node_local(self) -> bool:
        return not self.layout.shared

    def supersede_after(self, step: int) -> None:
        """Before training from `step`: torn dirs are deleted, later committed ones set aside.
        Rank 0 tends the shared tiers; on node-local disks each node's first rank its own."""
        if self.node_local and self.layout.leader:
            _supersede(self.local, step, NODE_DONE)
        if self.rank == 0:
            if not self.node_local:
                _supersede(self.local, step, COMMITTED)
            if self.durable is not None:
                # Every rank is at the barrier below, so no node's copy is running: parts of a
                # durable checkpoint a crash left unassembled go.
                for partial in self.durable.glob(f".{PREFIX}*.partial"):
                    shutil.rmtree(partial, ignore_errors=True)
                _supersede(self.durable, step, COMMITTED)
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

    def close(self) -> None:
        """End of the generation: the staging thread goes and a save still in flight is
        abandoned (never committed, so no restart resumes from it). After `finish` nothing is
        in flight; after a failure a durable copy may still run, on a daemon thread that
        touches files only."""
        self._stager.shutdown()

    def _commit(self) -> None:
        p = self._pending
        assert p is not None
        self._pending = None
        if p.future is not None:
            # Each rank's save returns only after every rank's write landed and rank 0 wrote
            # .metadata (DCP's last step is a collective).
            p.future.result()
        if self.node_local:
            if self.layout.leader:
                _write_atomic(p.path / NODE_DONE, json.dumps({"step": p.step}))
                self._start_copy(self._copy_node_part, p)
                self._prune(self.local, NODE_DONE)
            return
        if self.rank != 0:
            return
        _write_atomic(p.path / COMMITTED, json.dumps({"step": p.step}))
        self._report(p.step, p.blocked_s, p.path)
        if self.durable is not None:
            self._start_copy(self._copy_durable, p)
        self._prune(self.local)

    def _start_copy(self, copy: Any, p: _Pending) -> None:
        if self._copier is not None:
            self._copier.join()
        self._copier = threading.Thread(
            target=copy, args=(p.path, p.step, p.blocked_s), name="ckpt-durable", daemon=True
        )
        self._copier.start()

    def _copy_durable(self, src: Path, step: int, blocked_s: float) -> None:
        """A shared fast tier: rank 0 copies the whole checkpoint, then commits the copy."""
        assert self.durable is not None
        self.durable.mkdir(parents=True, exist_ok=True)
        tmp = self.durable / f".{src.name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(COMMITTED))
        self._commit_durable(tmp, src.name, step)

    def _copy_node_part(self, src: Path, step: int, blocked_s: float) -> None:
        """A node-local fast tier: this node's files join the checkpoint being assembled in the
        durable tier; rank 0 commits it once every node's part is there."""
        assert self.durable is not None
        tmp = self.durable / f".{src.name}.partial"
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(NODE_DONE), dirs_exist_ok=True)
        (tmp / COPIED).mkdir(exist_ok=True)
        (tmp / COPIED / self.layout.node).touch()
        if self.rank != 0:
            return
        deadline = time.monotonic() + NODE_COPY_TIMEOUT_S
        while not all((tmp / COPIED / n).exists() for n in self.layout.nodes):
            if time.monotonic() > deadline:
                print(
                    f"checkpoint step {step}: not every node copied its part to "
                    f"{self.durable} in {NODE_COPY_TIMEOUT_S:.0f} s; not committed",
                    flush=True,
                )
                return
            time.sleep(0.1)
        shutil.rmtree(tmp / COPIED)
        self._commit_durable(tmp, src.name, step)
        # Only now can a restart resume from it (nothing resumes from a node-local part).
        self._report(step, blocked_s, self.durable / src.name)

    def _report(self, step: int, blocked_s: float, path: Path) -> None:
        if self.on_commit is not None:
            self.on_commit(step, blocked_s, path)

    def _commit_durable(self, tmp: Path, name: str, step: int) -> None:
        assert self.durable is not None
        dst = self.durable / name
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
        _write_atomic(dst / COMMITTED, json.dumps({"step": step}))
        self._prune(self.durable)

    def _prune(self, tier: Path, marker: str = COMMITTED) -> None:
        for _, d in committed_steps(tier, marker)[: -self.keep]:
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
