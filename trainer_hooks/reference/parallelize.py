"""Apply 3D parallelism: a (pp, dp, tp) DeviceMesh, DTensor TP, pipeline stages, and DP.

Data parallel has two modes. `allreduce` (default): parameters replicated over dp and, after
the pipeline schedule's backward, each gradient's local shard all-reduced (summed, then / dp)
over the mesh's dp dimension, DDP's arithmetic without its buckets (DDP itself does not take
DTensor parameters without a private pre-transform). `fsdp`: FSDP2 `fully_shard` per block and
per stage over the dp mesh, composed with TP (2D DTensors) and the pipelining schedule, which
drives its gradient sync. Both run on gloo and NCCL, both resume bit-identically; allreduce is
the default because on CPU/gloo FSDP2's per-micro-batch all-gathers cost more than they save
for a model this small.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from trainer_hooks.reference.model import Transformer, keep_stage, loss_fn

SCHEDULES: dict[str, type[PipelineScheduleSingle]] = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


def build_mesh(device_type: str, pp: int, dp: int, tp: int) -> DeviceMesh:
    """Ranks are laid out pp-major, tp-minor: a TP group is adjacent ranks (one node's GPUs)."""
    return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


def apply_tp(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Megatron layout: column-wise QKV and MLP up, row-wise attention out and MLP down."""
    if tp_mesh.size() == 1:
        return
    plan = {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(),
        "ffn.w1": ColwiseParallel(),
        "ffn.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh) -> None:
    """FSDP2 over dp: each block, then the stage's remaining params (embeddings, norm, head)."""
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def build_stage_model(
    model: Transformer, mesh: DeviceMesh, device: torch.device, dp_mode: str = "allreduce"
) -> tuple[Transformer, int, int]:
    """Prune the full (identically initialised) model to this rank's stage; TP, then FSDP."""
    pp_mesh = mesh["pp"]
    stage, stages = pp_mesh.get_local_rank(), pp_mesh.size()
    keep_stage(model, stage, stages)
    model.to(device)
    apply_tp(model, mesh["tp"])
    if dp_mode == "fsdp":
        apply_fsdp(model, mesh["dp"])
    return model, stage, stages


class PipelineSchedules:
    """This rank's stage's pipeline schedule for each micro-batch count, built on first use.

    A replica of the fault-tolerant mode runs as many micro-batches as its share of the global
    batch (more while a replica is missing); a schedule and its stage hold per-micro-batch
    buffers, so each count gets its own. Gradients come back summed over the micro-batches
    (`scale_grads=False`): the step divides them by the micro-batches of the whole batch.
    """

    def __init__(self, model: Transformer, mesh: DeviceMesh, device: torch.device, kind: str):
        self.model, self.device, self.kind = model, device, kind
        self.pp = mesh["pp"]
        self._built: dict[int, PipelineScheduleSingle] = {}

    def __call__(self, microbatches: int) -> PipelineScheduleSingle:
        if microbatches not in self._built:
            stage = PipelineStage(
                self.model,
                self.pp.get_local_rank(),
                self.pp.size(),
                self.device,
                group=self.pp.get_group(),
            )
            self._built[microbatches] = SCHEDULES[self.kind](
                stage, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=False
            )
        return self._built[microbatches]


def build_schedules(
    model: Transformer, mesh: DeviceMesh, device: torch.device, kind: str
) -> PipelineSchedules | None:
    """The pipeline schedules of this rank's stage, or None when pp == 1 (plain accumulation)."""
    return None if mesh["pp"].size() == 1 else PipelineSchedules(model, mesh, device, kind)


def local_grad(p: nn.Parameter) -> torch.Tensor | None:
    g = p.grad
    if g is None:
        return None
    return g.to_local() if isinstance(g, DTensor) else g


@torch.no_grad()
def all_reduce_dp_grads(model: nn.Module, dp_mesh: DeviceMesh) -> None:
    """Average gradients over data-parallel replicas (sum in a fixed ring order, then / dp)."""
    n = dp_mesh.size()
    if n == 1:
        return
    group = dp_mesh.get_group()
    for p in model.parameters():
        g = local_grad(p)
        if g is not None:
            dist.all_reduce(g, group=group)
            g.div_(n)


def _sharded_dims(g: torch.Tensor) -> tuple[str, ...]:
    """Mesh dims over which this gradient is split (a plain tensor: none)."""
    if not isinstance(g, DTensor):
        return ()
    names = g.device_mesh.mesh_dim_names or ()
    # Anything not replicated or partial is a split (FSDP2 over TP uses _StridedShard, which
    # is not a Shard).
    split = [not (pl.is_replicate() or pl.is_partial()) for pl in g.placements]
    return tuple(n for n, s in zip(names, split, strict=True) if s)


@torch.no_grad()
def clip_grad_norm(model: nn.Module, mesh: DeviceMesh, max_norm: float) -> torch.Tensor:
    """Global L2 norm over every shard of every stage, then scale grads to at most `max_norm`.

    Squares are summed locally per kind of sharding, then over exactly the mesh dims that kind
    is split over (tp for TP shards, dp for FSDP shards, both for 2D); a dim a gradient is
    replicated over is counted once. Stages are summed over pp. Every rank gets the same norm.
    """
    sums: dict[tuple[str, ...], torch.Tensor] = {}
    for p in model.parameters():
        g = local_grad(p)
        if g is None:
            continue
        assert p.grad is not None
        key = _sharded_dims(p.grad)
        sq = g.detach().double().pow(2).sum().cpu()
        sums[key] = sums[key] + sq if key in sums else sq
    total = torch.zeros((), dtype=torch.float64)
    for key in sorted(sums):
        for dim in key:
            dist.all_reduce(sums[key], group=mesh[dim].get_group())
        total += sums[key]
    if mesh["pp"].size() > 1:
        dist.all_reduce(total, group=mesh["pp"].get_group())
    norm = total.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    if max_norm > 0:
        for p in model.parameters():
            g = local_grad(p)
            if g is not None:
                g.mul_(coef.to(device=g.device, dtype=g.dtype))
    return norm.float()
