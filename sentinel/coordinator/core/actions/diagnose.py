"""Diagnosis actions: ask the job's ranks for evidence and turn it into culprit nodes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sentinel.coordinator.core.actions.base import (
    ActionContext,
    BaseAction,
    StepResult,
    StepStatus,
    WaitParams,
)
from sentinel.coordinator.core.rows import JobRow, StoredEvent
from sentinel.protocol import CommandKind, FrAnalysisPayload, RankSdcPayload


def node_of_rank(job: JobRow | None, rank: int) -> str | None:
    if job is None:
        return None
    nodes, per = job.status.nodes, job.status.gpus_per_node
    idx = rank // per
    return nodes[idx] if 0 <= idx < len(nodes) else None


@dataclass(frozen=True)
class Digest:
    """One rank's SDC check answer, as a diagnosis reads it."""

    node: str | None
    step: int
    digest: str
    mismatched_ranks: list[int]

    @classmethod
    def of(cls, event: StoredEvent) -> Digest:
        p = RankSdcPayload.model_validate(event.payload)
        return cls(event.node, p.step, p.digest, p.mismatched_ranks)


def disagreeing_nodes(digests: list[Digest]) -> list[str]:
    """Nodes of ranks whose digest differs from the majority for the same step."""
    by_step: dict[int, list[Digest]] = {}
    for d in digests:
        by_step.setdefault(d.step, []).append(d)
    culprits: set[str] = set()
    for rows in by_step.values():
        if len(rows) < 2:
            continue
        majority, _ = Counter(r.digest for r in rows).most_common(1)[0]
        culprits.update(r.node for r in rows if r.digest != majority and r.node)
    return sorted(culprits)


def named_nodes(job: JobRow | None, rows: list[Digest]) -> list[str]:
    """Nodes of the ranks a rank's own cross-rank check named (`mismatched_ranks`)."""
    ranks = {r for row in rows for r in row.mismatched_ranks}
    return sorted({n for r in ranks if (n := node_of_rank(job, r))})


def complete_check(rows: list[Digest], world: int) -> list[Digest]:
    """The rows of the latest step that every rank answered for (none if no step is complete)."""
    by_step: dict[int, list[Digest]] = {}
    for r in rows:
        by_step.setdefault(r.step, []).append(r)
    done = [s for s, rs in by_step.items() if len(rs) >= max(world, 2)]
    return by_step[max(done)] if done else []


class SdcRecompute(
    BaseAction[WaitParams], name="sdc_recompute", dry_run="would run a recompute-diff"
):
    """Have every rank recompute the suspect step; nodes that disagree are culprits."""

    def act(self, ctx: ActionContext, params: WaitParams) -> StepResult:
        job = ctx.job()
        step = ctx.incident.first_step or 0
        cid = ctx.issue_command(CommandKind.SDC_CHECK, {"step": step, "check_id": ctx.command_id()})
        # Answers: the ranks quote the check id, but every rank runs the check at the same step
        # (their gang exchange decides it together), so any whole-gang matmul check of a later
        # step than the suspect one, made after the command was sent, is a recompute too,
        # whichever rank heard of the command first.
        assert ctx.job_id is not None  # issue_command refused a job-less incident
        answers = ctx.store.sdc_digests(ctx.job_id, cid, ctx.step_started_at, step)
        world = job.status.world_size if job else 0
        rows = complete_check([Digest.of(e) for e in answers], world)
        if not rows and not ctx.waited_past(params.timeout_s):
            return StepResult(StepStatus.WAIT, {})
        if not rows:  # nobody answered: fall back to the digests that opened the incident
            opened = ctx.store.sdc_digests_of_incident(ctx.incident.id)
            rows = [Digest.of(e) for e in opened]
        culprits = disagreeing_nodes(rows) or named_nodes(job, rows)
        if not culprits:
            return StepResult(StepStatus.ESCALATE, {"reason": "recompute-diff found no culprit"})
        ctx.plan.culprits = culprits
        return StepResult(StepStatus.DONE, {"culprit_nodes": culprits, "digests": len(rows)})


# A process spinning in one C call holds a core; one waiting on a peer holds next to none.
SPINNING_SHARE = 0.5


def silenced(ctx: ActionContext) -> dict[int, str]:
    """The incident's ranks its agents saw hung from outside (sentinel/agent/ranks/watch.py)
    that cannot answer: stopped, or running on most of a core (a C call holding the GIL).
    rank -> process state. Such a rank gives no dump and no stacks: waiting for them only
    delays the repair. A rank the agent saw asleep is not taken for the culprit on that alone
    (its own watchdog may only have been late): the analysis decides."""
    out: dict[int, str] = {}
    for event in ctx.store.silenced_ranks(ctx.incident.id):
        state = str(event.payload.get("process_state") or "")
        share = event.payload.get("cpu_share") or 0.0
        stopped = state[:1] in ("T", "t")
        if event.rank is not None and (stopped or (state[:1] == "R" and share >= SPINNING_SHARE)):
            out[event.rank] = f"{state}, {share:.0%} of a core"
    return out


class FrDump(BaseAction[WaitParams], name="fr_dump", dry_run="would dump flight recorders"):
    """Dump every rank's flight recorder, analyze, and name the culprit ranks' nodes. A rank
    its agent saw hung from outside is the culprit as seen: the analysis, which would wait for
    that rank's dump until its deadline, is not waited for."""

    def act(self, ctx: ActionContext, params: WaitParams) -> StepResult:
        cid = ctx.issue_command(CommandKind.FR_DUMP, {"check_id": ctx.command_id()})
        assert ctx.job_id is not None  # issue_command refused a job-less incident
        row = ctx.store.fr_analysis(ctx.job_id, cid)
        if row is None:
            stuck = silenced(ctx)
            job = ctx.job()
            seen = sorted({n for r in stuck if (n := node_of_rank(job, r))})
            if seen:
                ctx.plan.culprits = seen
                detail = {"culprit_nodes": seen, "verdict": "seen hung from outside"}
                return StepResult(StepStatus.DONE, detail | {"silenced_ranks": stuck})
            if ctx.waited_past(params.timeout_s):
                return StepResult(StepStatus.ESCALATE, {"reason": "no flight-recorder analysis"})
            return StepResult(StepStatus.WAIT, {})
        analysis = FrAnalysisPayload.model_validate(row.payload)
        job = ctx.job()
        nodes = sorted({n for r in analysis.culprit_ranks if (n := node_of_rank(job, r))})
        if not nodes:
            return StepResult(
                StepStatus.ESCALATE,
                {"reason": "analysis named no culprit", **analysis.model_dump(mode="json")},
            )
        ctx.plan.culprits = nodes
        return StepResult(StepStatus.DONE, {"culprit_nodes": nodes, "verdict": analysis.verdict})
