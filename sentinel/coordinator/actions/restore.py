"""Returning an evicted node to service: an operator's decision, never a playbook's.

It runs only as a manual run (`POST /v1/actions` with the incident that evicted the node, which
audits who asked and why). Like a drain, the scheduler is told through an effect: the node moves
to `validating` and the return is recorded (`scontrol update State=RESUME`, the exclude file,
...); once the scheduler took it the node is `returned`, free to serve as a job's spare again,
and a scheduler that refused leaves it `evicted` and escalates.
"""

from __future__ import annotations

from pydantic import Field

from sentinel.coordinator import lifecycle
from sentinel.coordinator.actions.base import (
    ActionContext,
    ActionParams,
    BaseAction,
    StepResult,
    StepStatus,
)
from sentinel.coordinator.effects import EffectKind
from sentinel.coordinator.lifecycle import EffectState, Entity, NodeState


class ReturnParams(ActionParams):
    node: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ReturnNode(BaseAction[ReturnParams], name="return_node"):
    """Operator only: put an evicted node back in service (scheduler and fleet)."""

    def act(self, ctx: ActionContext, params: ReturnParams) -> StepResult:
        who = ctx.context.who or ""
        if not who.startswith(("operator:", "admin:")):
            return StepResult(
                StepStatus.ESCALATE, {"reason": "returning a node is an operator's action only"}
            )
        node, key = params.node, f"{ctx.key}/return:{params.node}"
        effect = ctx.store.effect(key)
        if effect is None:
            return self._start(ctx, key, node, who)
        if effect.state == EffectState.INTENDED:
            return StepResult(StepStatus.WAIT, {"returning": node})
        if effect.state == EffectState.FAILED:  # the scheduler kept it out: a person looks
            error = str(effect.result.get("error", "the return failed"))
            return StepResult(StepStatus.ESCALATE, {"node": node, "error": error})
        return StepResult(StepStatus.DONE, {"node": node, "did": effect.result.get("did", "")})

    @staticmethod
    def _start(ctx: ActionContext, key: str, node: str, who: str) -> StepResult:
        row = ctx.store.node(node)
        if row is None or row.state != NodeState.EVICTED:
            return StepResult(
                StepStatus.FAILED, {"error": f"{node} is not evicted (nothing to return)"}
            )
        if ctx.dry_run:
            return StepResult(StepStatus.DONE, {"did": f"dry-run: would return {node}"})
        why = f"returned by {who}"
        lifecycle.move(
            ctx.store,
            Entity.NODE,
            node,
            NodeState.VALIDATING,
            ctx.now,
            ctx.who,
            why,
            incident_id=ctx.incident.id,
        )
        lifecycle.intend_effect(
            ctx.store, key, EffectKind.RESTORE, node, {"reason": why}, ctx.incident.id, ctx.now
        )
        return StepResult(StepStatus.WAIT, {"returning": node})
