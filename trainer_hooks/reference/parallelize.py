"""Apply 3D parallelism: a (pp, dp, tp) DeviceMesh, DTensor TP, pipeline stages, DP all-reduce.

Data parallel is DDP-style replication done explicitly: after the pipeline schedule's backward,
each gradient's local shard is all-reduced (summed, then divided by dp) over the mesh's dp
dimension. Why not FSDP2 or DDP: `DistributedDataParallel` does not take DTensor parameters
without a private pre-transform, and FSDP2 composed with TP and the pipelining schedule on gloo
adds a reduce-scatter/all-gather per micro-batch that a model this small pays for in latency on
CPU; the explicit all-reduce is one collective per parameter per step, runs the same on gloo and
NCCL, and its reduction order is fixed, which the bit-identical resume relies on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
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


def build_stage_model(
    model: Transformer, mesh: DeviceMesh, device: torch.device
) -> tuple[Transformer, int, int]:
    """Prune the full (identically initialised) model to this rank's stage and shard it for TP."""
    pp_mesh = mesh["pp"]
    stage, stages = pp_mesh.get_local_rank(), pp_mesh.size()
    keep_stage(model, stage, stages)
    model.to(device)
    apply_tp(model, mesh["tp"])
    return model, stage, stages


def build_schedule(
    model: Transformer, mesh: DeviceMesh, device: torch.device, microbatches: int, kind: str
) -> PipelineScheduleSingle | None:
    """The pipeline schedule for this rank's stage, or None when pp == 1 (plain accumulation)."""
    pp_mesh = mesh["pp"]
    if pp_mesh.size() == 1:
        return None
    stage = PipelineStage(
        model, pp_mesh.get_local_rank(), pp_mesh.size(), device, group=pp_mesh.get_group()
    )
    return SCHEDULES[kind](stage, n_microbatches=microbatches, loss_fn=loss_fn, scale_grads=True)


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


@torch.no_grad()
def clip_grad_norm(model: nn.Module, mesh: DeviceMesh, max_norm: float) -> torch.Tensor:
    """Global L2 norm over every shard of every stage, then scale grads to at most `max_norm`.

    TP-sharded gradients (DTensor Shard) contribute their local squares summed over the tp group;
    replicated gradients are counted once; stages are summed over pp. After the dp all-reduce the
    replicas hold the same gradients, so dp needs no reduction. Every rank returns the same norm.
    """
    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        g = local_grad(p)
        if g is None:
            continue
        sq = g.detach().double().pow(2).sum().cpu()
        is_shard = isinstance(p.grad, DTensor) and any(pl.is_shard() for pl in p.grad.placements)
        if is_shard:
            sharded += sq
        else:
            replicated += sq
    if mesh["tp"].size() > 1:
        dist.all_reduce(sharded, group=mesh["tp"].get_group())
    total = sharded + replicated
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
