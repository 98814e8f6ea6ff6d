"""Job actions: they build the run's restart plan (`RepairPlan`) and send it to the supervisor.

`rollback`, `skip_batches` and `lr_scale` only shape the plan; `resume` sends it as one
`job.restart` command (the plan is its argument model) and waits until the supervisor reports
the new generation running.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sentinel.coordinator.core import lifecycle
from sentinel.coordinator.core.actions.base import (
    ActionContext,
    ActionParams,
    BaseAction,
    StepResult,
    StepStatus,
    WaitParams,
)
from sentinel.coordinator.core.actions.together import close_taken, take_along
from sentinel.coordinator.core.effects import EffectKind
from sentinel.coordinator.core.rows import JobRow
from sentinel.coordinator.core.states import EffectState
from sentinel.faults.repairs import repair
from sentinel.protocol import CommandKind, JobState, Recovery
from sentinel.protocol import LrScale as LrScalePlan


class StopParams(ActionParams):
    reason: str = "sentinel playbook"


class StopJob(BaseAction[StopParams], name="stop_job", dry_run="would stop the job", destroys=True):
    """Stop the job's gang (the supervisor stays up and waits for a restart)."""

    def act(self, ctx: ActionContext, params: StopParams) -> StepResult:
        cid = ctx.issue_command(CommandKind.JOB_STOP, {"reason": params.reason})
        return StepResult(StepStatus.DONE, {"command": cid})


class RollbackParams(ActionParams):
    # latest: the newest checkpoint; before_incident: the newest one at or before
    # (first suspect step - margin_steps). The first suspect step is the incident's first step,
    # or earlier when its evidence says since when the state may be bad (`suspect_since`).
    to: Literal["latest", "before_incident"] = "latest"
    margin_steps: int = Field(default=0, ge=0)


class Rollback(BaseAction[RollbackParams], name="rollback"):
    """Choose the checkpoint the restart resumes from."""

    def act(self, ctx: ActionContext, params: RollbackParams) -> StepResult:
        first = ctx.incident.first_step
        since = ctx.incident.detail.suspect_since
        if since is not None:
            first = since if first is None else min(first, since)
        if params.to == "before_incident" and first is not None:
            ctx.plan.resume_before_step = max(0, first - params.margin_steps)
        else:
            ctx.plan.resume_before_step = None
        return StepResult(StepStatus.DONE, {"resume_before_step": ctx.plan.resume_before_step})


class SkipParams(ActionParams):
    before: int = Field(default=0, ge=0)  # batches before the offending one
    after: int = Field(default=0, ge=0)  # and after it (PaLM skipped 200-500 at scale)


class SkipBatches(BaseAction[SkipParams], name="skip_batches"):
    """Add the batch range around the offending batch to the skip list."""

    def act(self, ctx: ActionContext, params: SkipParams) -> StepResult:
        detail = ctx.incident.detail
        batch = detail.batch if detail.batch is not None else ctx.incident.first_step
        if batch is None:
            return StepResult(StepStatus.FAILED, {"error": "the incident names no batch or step"})
        lo, hi = max(0, batch - params.before), batch + params.after
        if (lo, hi) not in ctx.plan.skip_batches:
            ctx.plan.skip_batches.append((lo, hi))
        return StepResult(StepStatus.DONE, {"skip": [lo, hi]})


class LrScaleParams(LrScalePlan):
    pass


class LrScale(BaseAction[LrScaleParams], name="lr_scale"):
    """Scale the learning rate by FACTOR for the first N steps after the restart."""

    def act(self, ctx: ActionContext, params: LrScaleParams) -> StepResult:
        ctx.plan.lr_scale = LrScalePlan(factor=params.factor, steps=params.steps)
        return StepResult(StepStatus.DONE, ctx.plan.lr_scale.model_dump())


class ResumeParams(WaitParams):
    timeout_s: float = Field(default=300.0, gt=0)
    # Restarts for this incident's fault with no checkpoint committed since, after which the
    # job is stopped and the incident escalated. None: the coordinator's `restart_budget`.
    budget: int | None = Field(default=None, ge=1)


class Resume(BaseAction[ResumeParams], name="resume", destroys=True):
    """Restart the gang with the plan (exclusions, spares, checkpoint, skips, LR), within the
    restart budget: a job that keeps failing for one cause without committing a checkpoint
    (a poison batch, a code bug) is stopped and handed to a person with its history."""

    def act(self, ctx: ActionContext, params: ResumeParams) -> StepResult:
        job = ctx.job()
        if job is None:
            return StepResult(StepStatus.FAILED, {"error": f"job {ctx.job_id!r} is not known"})
        ctx.plan.reason = f"incident {ctx.incident.id} ({ctx.incident.fault})"
        newest = max(job.status.checkpoints, default=None)
        key = f"generation_before:{ctx.key}"
        restarted = key in ctx.context.marks
        if not restarted and ctx.context.manual is None:
            spent = _budget_spent(ctx, params, newest)
            if spent is not None:
                return spent
        if not restarted and not ctx.dry_run:  # the job's other repairs' nodes leave with it
            draining = take_along(ctx)
            if draining is not None:
                return draining
        _plan_the_path(ctx)
        if ctx.dry_run:
            plan = ctx.plan.model_dump(mode="json")
            return StepResult(StepStatus.DONE, {"dry_run": "would restart", "plan": plan})
        before = ctx.context.marks.setdefault(key, job.generation)
        cid = ctx.issue_command(CommandKind.JOB_RESTART, ctx.plan.model_dump(mode="json"))
        if not restarted:
            close_taken(ctx, cid)
        generation = restarted_by(ctx, cid, job, before)
        if generation is not None:  # restarted; a new failure is a new incident
            # The newest checkpoint the coordinator knows once the new gang runs: when the
            # restart was decided, the supervisor may not have reported the one committed just
            # before the crash yet. A later crash with no newer one made no progress since.
            return StepResult(
                StepStatus.DONE,
                {"command": cid, "generation": generation, "newest_checkpoint": newest},
            )
        if job.state == JobState.FAILED:  # the supervisor could not form the gang and gave up
            return StepResult(
                StepStatus.FAILED,
                {"error": "the supervisor reports the job failed", "command": cid},
            )
        if ctx.waited_past(params.timeout_s):
            return StepResult(
                StepStatus.FAILED, {"error": "the job did not come back", "command": cid}
            )
        return StepResult(StepStatus.WAIT, {"command": cid})


def restarted_by(ctx: ActionContext, cid: str, job: JobRow, before: int) -> int | None:
    """The generation this step's restart brought up; None while it has not. The supervisor's
    acknowledgement names it; until that arrives, a newer generation than `before` counts only
    without the nodes this plan takes out: one another repair's restart launched, ordered
    before this one, is not this repair's."""
    row = ctx.store.command(cid)
    if row is not None and row.acked_at is not None:
        acked = (row.result or {}).get("generation")
        if isinstance(acked, int) and acked > before:
            return acked
    leaving = {*ctx.plan.exclude, *ctx.plan.spare_map}
    if job.generation > before and not leaving & set(job.status.nodes):
        return job.generation
    return None


def _plan_the_path(ctx: ActionContext) -> None:
    """The fault's repair path from the catalog, and the struck nodes whose rank processes
    cannot stay (a node-scoped incident's node, a job-scoped one's culprits), unless they
    leave the job anyway."""
    info = repair(ctx.incident.fault)
    ctx.plan.path = info.path
    ctx.plan.paths = [p for p in Recovery if p in info.allowed]
    if info.process == "replace":
        struck = (
            ctx.plan.culprits if ctx.incident.target.startswith("job:") else [ctx.incident.target]
        )
        leaving = {*ctx.plan.exclude, *ctx.plan.spare_map}
        ctx.plan.replace = sorted(n for n in struck if n not in leaving)


def _budget_spent(
    ctx: ActionContext, params: ResumeParams, newest: int | None
) -> StepResult | None:
    """Stop the job and escalate when it was restarted `budget` times for this fault since its
    newest checkpoint (none committed since); None while the budget lasts. A person's own
    restart (a manual run) is not counted against it or held to it."""
    budget = params.budget if params.budget is not None else ctx.cfg.restart_budget
    assert ctx.job_id is not None
    stuck = [
        r
        for r in ctx.store.done_steps("resume", ctx.job_id)
        if r.fault == ctx.incident.fault and r.result.get("newest_checkpoint") == newest
    ]
    if len(stuck) < budget:
        return None
    since = "no checkpoint yet" if newest is None else f"checkpoint step {newest}"
    why = (
        f"restart budget spent: {len(stuck)} restart(s) for {ctx.incident.fault} since "
        f"{since}, no checkpoint committed since (budget {budget}); the job is stopped"
    )
    history = [{"incident": r.incident_id, "at": r.done_at} for r in stuck]
    detail = {"error": why, "restarts": history, "newest_checkpoint": newest}
    if ctx.dry_run:
        return StepResult(StepStatus.ESCALATE, {**detail, "dry_run": "would stop the job"})
    cid = ctx.issue_command(CommandKind.JOB_STOP, {"reason": why}, suffix="-budget")
    return StepResult(StepStatus.ESCALATE, {**detail, "command": cid})


class WaitCheckpointParams(WaitParams):
    timeout_s: float = Field(default=900.0, gt=0)
    # Ask the job to save at its next step boundary (`checkpoint.now`) rather than wait for its
    # periodic save: a hot GPU or a slow node is taken out a step later, not up to a
    # checkpoint interval later, and still no work is lost.
    save_now: bool = False


class WaitCheckpoint(
    BaseAction[WaitCheckpointParams],
    name="wait_checkpoint",
    dry_run="would wait for a checkpoint",
):
    """Wait for the job's next checkpoint (act then, losing no work), asking for one now if
    `save_now`."""

    def act(self, ctx: ActionContext, params: WaitCheckpointParams) -> StepResult:
        job = ctx.job()
        newest = max(job.status.checkpoints, default=-1) if job else -1
        floor = ctx.context.marks.setdefault(f"ckpt_floor:{ctx.key}", newest)
        if params.save_now and not ctx.dry_run:  # the same id each tick: queued once
            ctx.issue_command(CommandKind.CHECKPOINT_NOW, {"reason": f"incident {ctx.incident.id}"})
        if newest > floor:
            return StepResult(StepStatus.DONE, {"checkpoint": newest})
        if ctx.waited_past(params.timeout_s):
            return StepResult(StepStatus.DONE, {"timed_out": True, "checkpoint": newest})
        return StepResult(StepStatus.WAIT, {})


class NotifyParams(ActionParams):
    message: str = "incident needs attention"
    severity: Literal["info", "warning", "critical"] = "warning"


class Notify(BaseAction[NotifyParams], name="notify"):
    """Tell a person (coordinator log + audit; Alertmanager scrapes the metrics)."""

    def act(self, ctx: ActionContext, params: NotifyParams) -> StepResult:
        args = {"message": params.message, "severity": params.severity}
        effect = ctx.store.effect(ctx.key)
        if effect is None:
            lifecycle.intend_effect(
                ctx.store,
                ctx.key,
                EffectKind.NOTIFY,
                f"incident:{ctx.incident.id}",
                args,
                ctx.incident.id,
                ctx.now,
            )
            return StepResult(StepStatus.WAIT, {})
        if effect.state == EffectState.INTENDED:
            return StepResult(StepStatus.WAIT, {})
        return StepResult(StepStatus.DONE, args)
