"""`teardown`: stop the job's gang and wait for the supervisor to confirm that no rank survived.

The supervisor ends the gang bounded (SIGTERM, a grace period, SIGKILL to what is left) and
verifies it (no rank process, nor any process below one, is left: `sentinel.processes`), and
acknowledges the `job.stop` with how it went. The step records that and how long each stage of
the hang's repair took from the incident's opening (the hang verdict): dumps saved, stacks
saved, all ranks gone. A rank that survived SIGKILL (stuck in the kernel, holding its device)
escalates to a person: a restart on that node would not get its GPU.
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
from sentinel.protocol import CommandKind, StopPlan

# Earlier steps whose end is a stage of the hang's repair, by the stage's name.
STAGE_STEPS = {"fr_dump": "dumps_saved_s", "evidence": "evidence_saved_s"}


class TeardownParams(WaitParams):
    reason: str = "sentinel: hang teardown"
    timeout_s: float = Field(default=60.0, gt=0)  # for the supervisor's confirmation


def stages(ctx: ActionContext, gone_at: float) -> dict[str, float]:
    """Seconds from the incident's opening to the end of each stage done so far."""
    opened = ctx.incident.opened_at
    out: dict[str, float] = {}
    for step in ctx.store.incident_steps(ctx.incident.id):
        name = STAGE_STEPS.get(step.action)
        if name and step.done_at is not None and name not in out:
            out[name] = round(step.done_at - opened, 3)
    out["all_ranks_gone_s"] = round(gone_at - opened, 3)
    return out


class Teardown(
    BaseAction[TeardownParams], name="teardown", dry_run="would stop the gang", destroys=True
):
    """Stop the gang (signal, grace, SIGKILL) and wait until no rank survives."""

    def act(self, ctx: ActionContext, params: TeardownParams) -> StepResult:
        # The diagnosis's culprits are stuck: their processes end; the others may stay warm.
        stop = StopPlan(reason=params.reason, replace=list(ctx.plan.culprits))
        cid = ctx.issue_command(CommandKind.JOB_STOP, stop.model_dump(mode="json"))
        row = ctx.store.command(cid)
        if row is None or row.acked_at is None:
            if ctx.waited_past(params.timeout_s):
                return StepResult(
                    StepStatus.ESCALATE,
                    {"reason": "the supervisor did not confirm the gang stopped", "command": cid},
                )
            return StepResult(StepStatus.WAIT, {"command": cid})
        done: dict[str, Any] | None = (row.result or {}).get("teardown")
        detail: dict[str, Any] = {
            "command": cid,
            "teardown": done,
            "stages_s": stages(ctx, row.acked_at),
        }
        if done is not None and done.get("survivors"):
            return StepResult(
                StepStatus.ESCALATE, {"reason": "rank processes survived SIGKILL", **detail}
            )
        return StepResult(StepStatus.DONE, detail)
