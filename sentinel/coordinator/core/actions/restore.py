"""Returning an evicted node to service: an operator's decision, never a playbook's.

It runs only as a manual run (`POST /v1/actions` with the incident that evicted the node, which
audits who asked and why). The node moves to `validating` and passes the gate of
`coordinator/validation.py` first: its agent healthy for the hold-down, then the validation
burn-in on the node against the fleet baseline, where the scheduler lets it run (the eviction
backend holds the node for it: on Slurm a maintenance reservation of its own, whose name the
agent's command carries). A node that fails (or whose agent stays silent) goes back to
`evicted` with the reason, is released from its hold, and the step escalates. Like a drain, the scheduler is
then told through an effect (`scontrol update State=RESUME`, the exclude file, ...); once the
scheduler took it the node is `returned`, free to serve as a job's spare again, and a scheduler
that refused leaves it `evicted` and escalates.

A lemon (`sentinel.faults.blame`: the incidents that took it out, weighted by how sure their
blame was, reach the threshold within the window) is not returned: the ordinary repair does not
cure it. The return escalates with the node's history until a person clears it, after a deep
repair, by asking again with `clear_lemon: true` (audited like every manual step).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from sentinel.coordinator.core import lifecycle, scheduler, validation
from sentinel.coordinator.core.actions.base import (
    ActionContext,
    ActionParams,
    BaseAction,
    StepResult,
    StepStatus,
)
from sentinel.coordinator.core.effects import EffectKind
from sentinel.coordinator.core.states import EffectState, Entity, NodeState
from sentinel.exitcodes import InputError
from sentinel.faults import blame


class ReturnParams(ActionParams):
    node: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    # The validation baseline; None: the coordinator's (`coordinator.validation.baseline`).
    baseline: Path | None = None
    # A person who had a lemon deep-repaired clears it (its history stays in the audit).
    clear_lemon: bool = False


def blame_history(ctx: ActionContext, node: str) -> list[dict[str, object]]:
    """The incidents whose repair took `node` out, each with its time and weight."""
    out: list[dict[str, object]] = []
    for step in ctx.store.done_steps("evict_node"):
        if node in step.result.get("nodes", []) and step.done_at is not None:
            entry = {"incident": step.incident_id, "fault": step.fault, "at": step.done_at}
            out.append({**entry, "weight": blame.confidence(step.fault)})
    return out


def _lemon(ctx: ActionContext, node: str, policy: blame.LemonPolicy) -> StepResult | None:
    """Escalate the return of a lemon, with its history; None for any other node."""
    history = blame_history(ctx, node)
    blamed = ((float(h["at"]), float(h["weight"])) for h in history)  # type: ignore[arg-type]
    score = blame.lemon_score(blamed, ctx.now, policy)
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
    """Operator only: put an evicted node back in service (scheduler and fleet), once it has
    been healthy for the hold-down and passed its validation burn-in (`validation.py`)."""

    def act(self, ctx: ActionContext, params: ReturnParams) -> StepResult:
        who = ctx.context.who or ""
        if not who.startswith(("operator:", "admin:")):
            return StepResult(
                StepStatus.ESCALATE, {"reason": "returning a node is an operator's action only"}
            )
        node, key = params.node, f"{ctx.key}/return:{params.node}"
        effect = ctx.store.effect(key)
        if effect is None:
            return self._gate(ctx, params, key, who)
        if effect.state == EffectState.INTENDED:
            return StepResult(StepStatus.WAIT, {"returning": node})
        if effect.state == EffectState.FAILED:  # the scheduler kept it out: a person looks
            error = str(effect.result.get("error", "the return failed"))
            return StepResult(StepStatus.ESCALATE, {"node": node, "error": error})
        done = {"node": node, "did": effect.result.get("did", "")}
        return StepResult(StepStatus.DONE, done | {"validation": effect.args.get("validation")})

    def _gate(self, ctx: ActionContext, params: ReturnParams, key: str, who: str) -> StepResult:
        """Validating: hold-down, then the validation burn-in; pass -> the RESTORE effect."""
        node, cfg = params.node, ctx.cfg.validation
        row = ctx.store.node(node)
        mine = (  # this step moved it (a coordinator restarted mid-wait finds it so)
            row is not None
            and row.state == NodeState.VALIDATING
            and (row.state_changed_at or 0.0) >= ctx.step_started_at
        )
        if row is None or not (mine or row.state == NodeState.EVICTED):
            state = row.state if row else "unknown"
            return StepResult(
                StepStatus.FAILED, {"error": f"{node} is {state}, not evicted (nothing to return)"}
            )
        try:
            baseline = validation.baseline_for(params.baseline, cfg)
        except InputError as e:  # no figures to judge it by: it stays (or goes back) out
            if mine:
                return _keep_out(ctx, node, str(e), {})
            return StepResult(StepStatus.ESCALATE, {"node": node, "reason": str(e)})
        if ctx.dry_run:
            return StepResult(
                StepStatus.DONE, {"did": f"dry-run: would validate and return {node}"}
            )
        lemon = None if mine or params.clear_lemon else _lemon(ctx, node, ctx.cfg.lemon)
        if lemon is not None:
            return lemon
        if not mine:
            why = f"returned by {who}: validating (hold-down, then burn-in)"
            _move(ctx, node, NodeState.VALIDATING, why)
            row = ctx.store.node(node)
        since = row.state_changed_at if row and row.state_changed_at else ctx.now
        rid = validation.request_id(ctx.command_id(), since)
        hold_key, release = f"{key}/hold:{rid}", f"{key}/release:{rid}"
        hold = ctx.store.effect(hold_key)
        held = validation.hold_down(ctx.store, node, ctx.now, cfg)
        if not held.done:  # (again, when its agent stopped being healthy during the burn-in)
            if ctx.now - since > cfg.hold_down_s + cfg.timeout_s:
                why = f"its agent was not healthy for {cfg.hold_down_s:g} s in a row"
                detail: dict[str, object] = {"healthy_since": held.healthy_since}
                return _keep_out(ctx, node, why, detail, release if hold else None)
            return StepResult(StepStatus.WAIT, {"node": node, "hold_down_left_s": held.left_s})
        if hold is None:  # where the scheduler would run nothing there, let the burn-in run
            why, incident, now = f"validating {node}", ctx.incident.id, ctx.now
            lifecycle.intend_effect(
                ctx.store, hold_key, EffectKind.HOLD, node, {"reason": why}, incident, now
            )
        if hold is None or hold.state == EffectState.INTENDED:
            return StepResult(StepStatus.WAIT, {"node": node, "holding": rid})
        if hold.state == EffectState.FAILED:
            error = str(hold.result.get("error", "it failed"))
            why = f"the scheduler could not hold it for its validation: {error}"
            return _keep_out(ctx, node, why, {"request": rid}, release)
        launch = dict(hold.result.get("launch") or {})
        asked = validation.ask(
            ctx.store, node, rid, baseline, cfg.timeout_s, ctx.now, ctx.incident.id, launch
        )
        got = validation.answer(ctx.store, node, rid)
        if got is None:
            if ctx.now - asked > cfg.timeout_s:
                why = f"its agent did not answer the validation within {cfg.timeout_s:g} s"
                return _keep_out(ctx, node, why, {"request": rid}, release)
            return StepResult(StepStatus.WAIT, {"node": node, "validating": rid})
        result = got.model_dump(mode="json")
        if not got.passed:
            return _keep_out(ctx, node, f"it failed validation: {got.reason}", result, release)
        why = f"returned by {who}: passed validation"
        args = {"reason": why, "validation": result}
        incident, now = ctx.incident.id, ctx.now
        lifecycle.intend_effect(ctx.store, key, EffectKind.RESTORE, node, args, incident, now)
        return StepResult(StepStatus.WAIT, {"returning": node, "validated": rid})


def _move(ctx: ActionContext, node: str, state: NodeState, why: str) -> None:
    at, who, incident = ctx.now, ctx.who, ctx.incident.id
    lifecycle.move(
        ctx.store, Entity.NODE, node, state, at, who, why, incident_id=incident, reason=why
    )


def _keep_out(
    ctx: ActionContext,
    node: str,
    why: str,
    detail: dict[str, object],
    release: str | None = None,
) -> StepResult:
    """Back to evicted, with the reason on the node and in the step: a person looks. A node
    held for its validation is released by the effect keyed `release` (out of service again
    where the scheduler looks)."""
    reason = f"{node} stays out of service: {why}"
    _move(ctx, node, NodeState.EVICTED, reason)
    if release is not None:
        incident, now = ctx.incident.id, ctx.now
        args = {"reason": scheduler.drain_reason(incident, why[:160])}
        lifecycle.intend_effect(ctx.store, release, EffectKind.RELEASE, node, args, incident, now)
    return StepResult(StepStatus.ESCALATE, {"node": node, "reason": reason, "validation": detail})
