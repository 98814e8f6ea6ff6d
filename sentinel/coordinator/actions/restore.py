"""Returning an evicted node to service: an operator's decision, never a playbook's.

It runs only as a manual run (`POST /v1/actions` with the incident that evicted the node, which
audits who asked and why), tells the scheduler (`scontrol update State=RESUME`, the exclude file,
...) and marks the node active again, so that it may serve as a spare once a job lists it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sentinel.coordinator.actions.base import (
    ActionContext,
    BaseAction,
    EvictionError,
    StepResult,
    StepStatus,
)


class ReturnParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ReturnNode(BaseAction):
    name = "return_node"
    Params = ReturnParams
    description = "operator only: put an evicted node back in service (scheduler and fleet)"

    def run(self, ctx: ActionContext, params: BaseModel) -> StepResult:
        assert isinstance(params, ReturnParams)
        if not str(ctx.context.get("_who", "")).startswith(("operator:", "admin:")):
            return StepResult(
                StepStatus.ESCALATE, {"reason": "returning a node is an operator's action only"}
            )
        row = ctx.store.one("SELECT state FROM nodes WHERE name=?", (params.node,))
        if row is None or row["state"] != "evicted":
            return StepResult(
                StepStatus.FAILED, {"error": f"{params.node} is not evicted (nothing to return)"}
            )
        if ctx.dry_run:
            return StepResult(StepStatus.DONE, {"did": f"dry-run: would return {params.node}"})
        try:
            did = ctx.backend.restore(params.node, f"returned by {ctx.context['_who']}")
        except EvictionError as e:
            return StepResult(StepStatus.ESCALATE, {"node": params.node, "error": str(e)})
        ctx.store.execute(
            "UPDATE nodes SET state='active', reason=NULL, state_changed_at=? WHERE name=?",
            (ctx.now, params.node),
        )
        return StepResult(StepStatus.DONE, {"node": params.node, "did": did})
