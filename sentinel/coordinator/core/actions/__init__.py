"""Playbook actions, by name. Add one: subclass BaseAction in a small module (`base.py` says
how), list it here."""

from __future__ import annotations

from typing import Any

from sentinel.coordinator.core.actions.base import (
    ActionContext,
    BaseAction,
    StepResult,
    StepStatus,
)
from sentinel.coordinator.core.actions.diagnose import FrDump, SdcRecompute
from sentinel.coordinator.core.actions.eviction import EvictNode, SwapSpare
from sentinel.coordinator.core.actions.evidence import Evidence
from sentinel.coordinator.core.actions.job import (
    LrScale,
    Notify,
    Resume,
    Rollback,
    SkipBatches,
    StopJob,
    WaitCheckpoint,
)
from sentinel.coordinator.core.actions.restore import ReturnNode
from sentinel.coordinator.core.actions.teardown import Teardown

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
        Evidence(),
        Teardown(),
    )
}

__all__ = [
    "ACTIONS",
    "ActionContext",
    "BaseAction",
    "StepResult",
    "StepStatus",
]
