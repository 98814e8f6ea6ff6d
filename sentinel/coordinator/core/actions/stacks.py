"""`stacks`: save every rank's Python stacks with the incident (the hang playbook's evidence).

Asks the agents of the job's nodes for their ranks' stacks (`coordinator/stacks.py`), waits until
every rank answered or `timeout_s`, and records the groups (identical stacks together, odd ones
out first) and the silent ranks in the step's result, hence the audit. A rank that does not
answer is evidence, not a failure: the step is done either way and the playbook goes on.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sentinel.coordinator.core.actions.base import (
    ActionContext,
    BaseAction,
    StepResult,
    StepStatus,
    WaitParams,
)
from sentinel.coordinator.core.actions.diagnose import silenced
from sentinel.coordinator.core.stacks import answers, ask
from sentinel.stacks.group import Grouped, StackGroup, rank_ranges

GROUPS_KEPT = 8  # groups whose frames go into the record; the rest by their ranks only
FRAMES_KEPT = 12  # innermost frames per thread in the record (all are in the stored answers)


class StacksParams(WaitParams):
    timeout_s: float = Field(default=20.0, gt=0)


def _summary(g: StackGroup, with_frames: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"ranks": rank_ranges(g.ranks), "count": len(g.ranks)}
    if with_frames:
        out["threads"] = {
            t.name: [f"{f.file}:{f.line} {f.func}" for f in t.frames[-FRAMES_KEPT:]]
            for t in g.threads
        }
    return out


def record(grouped: Grouped, request_id: str) -> dict[str, Any]:
    """What the incident keeps: the request (its answers stay readable through the API while
    the events are retained), who answered, and the groups, odd ones out first."""
    return {
        "request": request_id,
        "answered": grouped.answered,
        "world_size": grouped.world_size,
        "missing_ranks": rank_ranges(grouped.missing),
        "groups": [_summary(g, i < GROUPS_KEPT) for i, g in enumerate(grouped.groups)],
    }


class CollectStacks(
    BaseAction[StacksParams], name="stacks", dry_run="would collect every rank's stacks"
):
    """Save every rank's Python stacks with the incident, grouped (odd ones first)."""

    def act(self, ctx: ActionContext, params: StacksParams) -> StepResult:
        if ctx.job_id is None:
            return StepResult(StepStatus.FAILED, {"error": "the incident names no job"})
        rid = ctx.command_id("-stacks")
        try:  # idempotent: the commands' ids derive from the step's key
            ask(ctx.store, ctx.job_id, rid, ctx.now, ctx.incident.id)
            grouped = answers(ctx.store, ctx.job_id, rid)
        except LookupError as e:  # no job or no node: nothing to ask, the repair goes on
            return StepResult(StepStatus.DONE, {"error": str(e)})
        timed_out = ctx.waited_past(params.timeout_s)
        stuck = silenced(ctx)  # they cannot answer: their silence is the evidence
        if set(grouped.missing) - set(stuck) and not timed_out:
            return StepResult(StepStatus.WAIT, {"answered": grouped.answered})
        detail = record(grouped, rid)
        if stuck:
            detail["silenced_ranks"] = stuck
        detail["stacks_saved_s"] = round(ctx.now - ctx.incident.opened_at, 3)
        return StepResult(StepStatus.DONE, detail)
