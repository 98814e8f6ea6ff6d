"""Diagnosis actions: ask the job's ranks for evidence and turn it into culprit nodes."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sentinel.coordinator.actions.base import ActionContext, BaseAction, StepResult, StepStatus
from sentinel.protocol import CommandKind


class _WaitParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    timeout_s: float = Field(default=120.0, gt=0)


def node_of_rank(job: dict[str, Any] | None, rank: int) -> str | None:
    if job is None:
        return None
    status = job["status"]
    nodes, per = list(status.get("nodes", [])), int(status.get("gpus_per_node", 1))
    idx = rank // per
    return nodes[idx] if 0 <= idx < len(nodes) else None


def disagreeing_nodes(digests: list[dict[str, Any]]) -> list[str]:
    """Nodes of ranks whose digest differs from the majority for the same step."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for d in digests:
        by_step.setdefault(int(d["step"]), []).append(d)
    culprits: set[str] = set()
    for rows in by_step.values():
        if len(rows) < 2:
            continue
        majority, _ = Counter(r["digest"] for r in rows).most_common(1)[0]
        culprits.update(r["node"] for r in rows if r["digest"] != majority and r["node"])
    return sorted(culprits)


def named_nodes(job: dict[str, Any] | None, rows: list[dict[str, Any]]) -> list[str]:
    """Nodes of the ranks a rank's own cross-rank check named (`mismatched_ranks`)."""
    ranks = {int(r) for row in rows for r in json.loads(row.get("mismatched") or "[]")}
    return sorted({n for r in ranks if (n := node_of_rank(job, r))})


_SDC_ROWS = (
    "SELECT node, json_extract(payload,'$.step') AS step,"
    " json_extract(payload,'$.digest') AS digest,"
    " json_extract(payload,'$.mismatched_ranks') AS mismatched FROM events"
    " WHERE kind='rank.sdc' AND COALESCE(json_extract(payload,'$.check'),'matmul')='matmul'"
)


def complete_check(rows: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """The rows of the latest step that every rank answered for (none if no step is complete)."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    done = [s for s, rs in by_step.items() if len(rs) >= max(world, 2)]
    return by_step[max(done)] if done else []


class SdcRecompute(BaseAction):
    name = "sdc_recompute"
    Params = _WaitParams
    description = "have every rank recompute the suspect step; nodes that disagree are culprits"

    def run(self, ctx: ActionContext, params: BaseModel) -> StepResult:
        assert isinstance(params, _WaitParams)
        if ctx.dry_run:
            return StepResult(StepStatus.DONE, {"dry_run": "would run a recompute-diff"})
        job = ctx.job()
        step = ctx.incident.get("first_step") or 0
        cid = ctx.issue_command(CommandKind.SDC_CHECK, {"step": step, "check_id": ctx.command_id()})
        # Answers: the ranks quote the check id, but every rank runs the check at the same step
        # (their gang exchange decides it together), so any whole-gang matmul check of a later
        # step than the suspect one, made after the command was sent, is a recompute too,
        # whichever rank heard of the command first.
        rows = ctx.store.query(
            _SDC_ROWS + " AND job=? AND (json_extract(payload,'$.check_id')=?"
            " OR (received_at>=? AND json_extract(payload,'$.step')>?))",
            (ctx.job_id, cid, ctx.step_started_at, step),
        )
        world = int(job["status"].get("world_size", 0)) if job else 0
        rows = complete_check(rows, world)
        timed_out = ctx.now - ctx.step_started_at > params.timeout_s
        if not rows and not timed_out:
            return StepResult(StepStatus.WAIT, {})
        if not rows:  # nobody answered: fall back to the digests that opened the incident
            rows = ctx.store.query(_SDC_ROWS + " AND incident_id=?", (ctx.incident["id"],))
        culprits = disagreeing_nodes(rows) or named_nodes(job, rows)
        if not culprits:
            return StepResult(StepStatus.ESCALATE, {"reason": "recompute-diff found no culprit"})
        ctx.context["culprit_nodes"] = culprits
        return StepResult(StepStatus.DONE, {"culprit_nodes": culprits, "digests": len(rows)})


class FrDump(BaseAction):
    name = "fr_dump"
    Params = _WaitParams
    description = "dump every rank's flight recorder, analyze, and name the culprit ranks' nodes"

    def run(self, ctx: ActionContext, params: BaseModel) -> StepResult:
        assert isinstance(params, _WaitParams)
        if ctx.dry_run:
            return StepResult(StepStatus.DONE, {"dry_run": "would dump flight recorders"})
        cid = ctx.issue_command(CommandKind.FR_DUMP, {"check_id": ctx.command_id()})
        row = ctx.store.one(
            "SELECT payload FROM events WHERE kind='fr.analysis' AND job=?"
            " AND json_extract(payload,'$.check_id')=? ORDER BY ts DESC LIMIT 1",
            (ctx.job_id, cid),
        )
        if row is None:
            if ctx.now - ctx.step_started_at > params.timeout_s:
                return StepResult(StepStatus.ESCALATE, {"reason": "no flight-recorder analysis"})
            return StepResult(StepStatus.WAIT, {})
        analysis = row["payload"]
        job = ctx.job()
        nodes = sorted({n for r in analysis["culprit_ranks"] if (n := node_of_rank(job, r))})
        if not nodes:
            return StepResult(
                StepStatus.ESCALATE, {"reason": "analysis named no culprit", **analysis}
            )
        ctx.context["culprit_nodes"] = nodes
        return StepResult(StepStatus.DONE, {"culprit_nodes": nodes, "verdict": analysis["verdict"]})
