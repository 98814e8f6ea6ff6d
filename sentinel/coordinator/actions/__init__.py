"""Playbook actions, by name. Add one: subclass BaseAction in a small module (`base.py` says
how), list it here."""

from __future__ import annotations

from typing import Any

from sentinel.coordinator.actions.base import (
    ActionContext,
    BaseAction,
    EvictionBackend,
    StepResult,
    StepStatus,
)
from sentinel.coordinator.actions.diagnose import FrDump, SdcRecompute
from sentinel.coordinator.actions.eviction import EvictNode, SwapSpare, make_backend
from sentinel.coordinator.actions.job import (
    LrScale,
    Notify,
    Resume,
    Rollback,
    SkipBatches,
    StopJob,
    WaitCheckpoint,
)
from sentinel.coordinator.actions.restore import ReturnNode
from sentinel.coordinator.actions.stacks import CollectStacks
from sentinel.coordinator.actions.teardown import Teardown

ACTIONS: dict[str, BaseAction[Any]] = {
    a.name: a
    for a in (
        EvictNode(),
        SwapSpare(),
        StopJob(),
        Rollback(),
        SkipBatches(),
        LrScale(),
        Resume(),
        WaitCheckpoint(),
        Notify(),
        SdcRecompute(),
        FrDump(),
        ReturnNode(),
        CollectStacks(),
        Teardown(),
    )
}

__all__ = [
    "ACTIONS",
    "ActionContext",
    "BaseAction",
    "EvictionBackend",
    "StepResult",
    "StepStatus",
    "make_backend",
]
