"""Which lever buys what: the Sentinel model with one knob turned, on the same failures.

What each lever adds on the way from the baseline to Sentinel, cumulatively, is `decompose.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sentinel.lab.goodput.checkpoint import CheckpointSpec
from sentinel.lab.goodput.model import RecoveryModel
from sentinel.lab.goodput.simulate import Fleet, Summary

SPARES = (0, 1, 2, 4, 8)
DETECTION_FACTORS = (0.5, 2.0)
CHECKPOINT_COSTS_S = (0.5, 2.0, 5.0)


@dataclass(frozen=True)
class LeverRow:
    lever: str
    setting: str
    summary: Summary
    delta: float  # effective-training-time ratio minus the base model's


def variants(
    base: RecoveryModel, checkpoint: CheckpointSpec, gpus: int
) -> list[tuple[str, str, RecoveryModel]]:
    out = [("spares", str(k), base.replace(spares=k)) for k in SPARES]
    out += [
        ("checkpoint interval", "fixed 1 h", base.replace(checkpoint_interval_s=3600.0)),
        ("checkpoint interval", "Young/Daly", base.replace(checkpoint_interval_s=None)),
    ]
    out += [("detection time", f"x{f:g}", base.scale_detection(f)) for f in DETECTION_FACTORS]
    out += [
        ("checkpoint cost", f"{c:g} s", base.replace(checkpoint_cost_s=c))
        for c in CHECKPOINT_COSTS_S
    ]
    if base.live is not None and base.live.keep_batch:
        shrink = dataclasses.replace(base.live, keep_batch=False)
        out.append(("live path", "shrink the batch", base.replace(live=shrink)))
    sync = dataclasses.replace(checkpoint, asynchronous=False)
    out.append(
        (
            "checkpoint",
            f"synchronous save ({sync.blocking_s(gpus):.1f} s)",
            base.replace(checkpoint_cost_s=sync.blocking_s(gpus), checkpoint_commit_lag_s=0.0),
        )
    )
    return out


def lever_rows(
    fleet: Fleet, base: RecoveryModel, base_summary: Summary, checkpoint: CheckpointSpec
) -> list[LeverRow]:
    rows = []
    for lever, setting, model in variants(base, checkpoint, fleet.gpus):
        summary = fleet.evaluate(model)
        rows.append(LeverRow(lever, setting, summary, summary.mean - base_summary.mean))
    return rows
