"""Shared helpers for the coordinator tests."""

from __future__ import annotations

from pathlib import Path

from sentinel.config import CoordinatorConfig, EvictionBudgetConfig
from sentinel.protocol import Action as RecAction
from sentinel.protocol import (
    Event,
    EventKind,
    JobStatusPayload,
    RankCrashPayload,
    Source,
    XidPayload,
    make_event,
)

ROOT = Path(__file__).resolve().parent.parent


def cfg(tmp: Path, **kw: object) -> CoordinatorConfig:
    budget = kw.pop("eviction", EvictionBudgetConfig(max_per_window=3, window_s=3600, min_fleet=1))
    return CoordinatorConfig(state_dir=tmp / "state", eviction=budget, **kw)  # type: ignore[arg-type]


def xid(node: str, gpu: int = 0, code: int = 48, **kw: object) -> Event:
    payload = XidPayload(gpu=gpu, xid=code, name="Double-bit ECC error", action=RecAction.RESET_GPU)
    return make_event(EventKind.GPU_XID, Source(node=node), payload, **kw)  # type: ignore[arg-type]


def crash(node: str, rank: int, job: str = "job1", generation: int = 0) -> Event:
    return make_event(
        EventKind.RANK_CRASH,
        Source(node=node, rank=rank, job=job),
        RankCrashPayload(exit_code=3, generation=generation),
    )


def job_status(
    job: str,
    nodes: list[str],
    spares: list[str],
    generation: int = 0,
    state: str = "running",
    checkpoints: list[int] | None = None,
) -> Event:
    payload = JobStatusPayload(
        state=state,
        generation=generation,
        world_size=len(nodes) * 2,
        gpus_per_node=2,
        nodes=nodes,
        spares=spares,
        checkpoints=checkpoints or [],
    )
    return make_event(EventKind.JOB_STATUS, Source(job=job), payload)
