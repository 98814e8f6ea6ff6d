"""Returning an evicted node to service: an operator's decision, never a playbook's.

It runs only as a manual run (`POST /v1/actions` with the incident that evicted the node, which
audits who asked and why). Like a drain, the scheduler is told through an effect: the node moves
to `validating` and the return is recorded (`scontrol update State=RESUME`, the exclude file,
...); once the scheduler took it the node is `returned`, free to serve as a job's spare again,
and a scheduler that refused leaves it `evicted` and escalates.

A lemon (`sentinel.faults.blame`: the incidents that took it out, weighted by how sure their
blame was, reach the threshold within the window) is not returned: the ordinary repair does not
cure it. The return escalates with the node's history until a person clears it, after a deep
repair, by asking again with `clear_lemon: true` (audited like every manual step).
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
from sentinel.faults import blame


class ReturnParams(ActionParams):
    node: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    # A person who had a lemon deep-repaired clears it (its history stays in the audit).
    clear_lemon: bool = False


def blame_history(ctx: ActionContext, node: str) -> list[dict[str, object]]:
    """The incidents whose repair took `node` out, each with its time and weight."""
    out: list[dict[str, object]] = []
    for step in ctx.store.done_steps("evict_node"):
        if node in step.result.get("nodes", []) and step.done_at is not None:
            weight = blame.confidence(step.fault)
            out.append({"incident": step.incident_id, "fault": step.fault,
                        "at": step.done_at, "weight": weight})  # fmt: skip
    return out


def _lemon(ctx: ActionContext, node: str, policy: blame.LemonPolicy) -> StepResult | None:
    """Escalate the return of a lemon, with its history; None for any other node."""
    history = blame_history(ctx, node)
    score = blame.lemon_score(((float(h["at"]), float(h["weight"])) for h in history),  # type: ignore[arg-type]
                              ctx.now, policy)  # fmt: skip
    if not policy.enabled or score < policy.threshold:
        return None
    days = policy.window_s / blame.DAY_S
    reason = (
        f"{node} is a lemon: blame {score:g} >= {policy.threshold:g} within {days:g} days"
        f" ({len(history)} incident(s) took it out); the ordinary repair does not cure it."
        " A person clears it after a deep repair: return it again with clear_lemon: true"
    )
    return StepResult(StepStatus.ESCALATE, {"node": node, "reason": reason, "history": history})


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
            held = None if params.clear_lemon else _lemon(ctx, node, ctx.cfg.lemon)
            return held or self._start(ctx, key, node, who)
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
