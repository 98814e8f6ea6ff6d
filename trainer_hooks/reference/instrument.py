"""The reference trainer's Sentinel hooks: built from the job's mesh and model shape."""

from __future__ import annotations

import torch.distributed as dist

from trainer_hooks import SentinelHooks
from trainer_hooks.mfu import flops_per_token, non_embedding_params
from trainer_hooks.reference.job import Job


def replica_groups(job: Job) -> list[list[int]]:
    """Ranks holding the same parameters: one group per (pp stage, tp shard), across dp."""
    mesh = job.mesh.mesh  # global ranks, shape (pp, dp, tp)
    return [mesh[p, :, t].tolist() for p in range(job.cfg.pp) for t in range(job.cfg.tp)]


def stage_groups(job: Job) -> list[list[int]]:
    """Ranks doing the same work: one group per pipeline stage (its tensor-parallel shards
    split every product evenly, its data-parallel replicas repeat it)."""
    mesh = job.mesh.mesh  # global ranks, shape (pp, dp, tp)
    return [mesh[p].flatten().tolist() for p in range(job.cfg.pp)]


def rank_flops_per_token(job: Job) -> float:
    """This rank's share of TorchTitan's count: its pipeline stage, its tensor-parallel shard.

    Parameters are DTensors whose numel is the stage's full size, hence the division by tp."""
    cfg, m = job.cfg, job.cfg.model
    return flops_per_token(
        non_embedding_params(job.model) // cfg.tp,
        layers=m.layers // cfg.pp,
        heads=m.heads // cfg.tp,
        head_dim=m.head_dim,
        seq_len=m.seq,
    )


def build_hooks(job: Job) -> SentinelHooks:
    """Settings from SENTINEL_* variables (the supervisor sets the node, job and agent socket);
    the rank registers its GPU and its place in the mesh with its node's agent."""
    # A replica of the replica mode is a world of its own: the hooks speak of job ranks.
    world = None if job.replica is None else f"replica-{job.replica}"
    offset = 0 if job.replica is None else job.replica * dist.get_world_size()
    hooks = SentinelHooks.from_env(
        model=job.model,
        flops_per_token=rank_flops_per_token(job),
        device=job.device,
        replica_groups=replica_groups(job),
        peer_groups=stage_groups(job),
        world=world,
        rank_offset=offset,
    )
    mesh = job.mesh
    hooks.register_rank(
        tp=mesh["tp"].get_local_rank(),
        pp=mesh["pp"].get_local_rank(),
        dp=mesh["dp"].get_local_rank() if job.replica is None else job.replica,
    )
    return hooks
