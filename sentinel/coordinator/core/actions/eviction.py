"""Evicting a node (with the eviction budget) and swapping a hot spare in.

The drain itself is an effect (`core/effects.py`), made through an eviction backend
(`coordinator/backends/`).
"""

from __future__ import annotations

import math
from typing import Literal

from sentinel.coordinator.core import lifecycle, scheduler
from sentinel.coordinator.core.actions.base import (
    ActionContext,
    ActionParams,
    BaseAction,
    StepResult,
    StepStatus,
)
from sentinel.coordinator.core.effects import EffectKind
from sentinel.coordinator.core.rows import EffectRow, IncidentRow
from sentinel.coordinator.core.states import (
    ENDED_JOBS,
    OUT_OF_SERVICE,
    EffectState,
    Entity,
    NodeState,
    StepState,
)


class EvictParams(ActionParams):
    # incident: the incident's node(s); culprits: nodes a diagnosis step put in the context.
    target: Literal["incident", "culprits"] = "incident"
    reason: str = "sentinel playbook"
    # The scheduler already holds the node out (someone else drained it: `scheduler.drain`):
    # record it out without draining it again, so the scheduler keeps its own reason. The
    # eviction budget and the spare rail do not apply: Sentinel takes nothing out.
    adopt: bool = False


def nodes_of(incident: IncidentRow) -> list[str]:
    """The nodes an incident is about: its target node, or a job's the events came from."""
    if not incident.target.startswith("job:"):
        return [incident.target]
    return list(incident.detail.nodes)


def incident_nodes(ctx: ActionContext, target: str) -> list[str]:
    return list(ctx.plan.culprits) if target == "culprits" else nodes_of(ctx.incident)


def _budget_refusal(ctx: ActionContext, node: str) -> str | None:
    budget = ctx.cfg.eviction
    recent = ctx.store.count_nodes(OUT_OF_SERVICE, changed_since=ctx.now - budget.window_s)
    cap, why = budget.max_per_window, f"max {budget.max_per_window}"
    if budget.max_percent is not None:
        fleet = ctx.store.count_nodes([NodeState.ACTIVE, *OUT_OF_SERVICE])
        share = math.floor(fleet * budget.max_percent / 100)
        if share < cap:
            cap, why = share, f"max {budget.max_percent:g}% of {fleet} nodes = {share}"
    if recent >= cap:
        return (
            f"eviction budget spent: {recent} node(s) evicted in the last "
            f"{budget.window_s:g} s ({why})"
        )
    # A node that a hot spare of its job takes the place of leaves the fleet no smaller. The
    # spare turns active only when swapped in, after the node has drained: an incident on
    # another node meanwhile must not count that node as lost with nothing in its place.
    spares = _spares_left(ctx, node)
    replaced = bool(spares) and all(_one_left(*left) for left in spares.values())
    after = ctx.store.count_nodes([NodeState.ACTIVE]) - 1 + int(replaced)
    if after < budget.min_fleet:
        return f"evicting would leave {after} active node(s), below min_fleet {budget.min_fleet}"
    return None


def _is_free_spare(ctx: ActionContext, name: str) -> bool:
    row = ctx.store.node(name)
    return row is None or row.state in (NodeState.SPARE, NodeState.RETURNED)


def _spares_left(ctx: ActionContext, node: str) -> dict[str, tuple[int, int]]:
    """For each running job that holds `node`: its free hot spares and those already promised
    to the other nodes this run evicts."""
    out = {}
    for job in ctx.store.jobs(_JOBS_LIMIT, exclude_states=ENDED_JOBS):
        if node not in job.status.nodes:
            continue
        free = [s for s in job.status.spares if _is_free_spare(ctx, s)]
        mapped = ctx.plan.spare_map
        promised = [n for n in ctx.plan.exclude if n != node and n not in mapped]
        out[job.id] = (len(free), len(promised))
    return out


def _one_left(free: int, promised: int) -> bool:
    """A free spare is left for one more node after those already promised."""
    return free - promised >= 1


def _replacement_refusal(ctx: ActionContext, node: str) -> str | None:
    """A node in a job's gang may go only when a hot spare of that job can take its place:
    the gang's shape (TP x PP x DP) is fixed, so evicting it without one would shrink the job
    or leave it unable to start. Spares already promised to nodes this run evicted count as
    taken."""
    for job, (free, promised) in _spares_left(ctx, node).items():
        if not _one_left(free, promised):
            return (
                f"no hot spare left to take {node}'s place in job {job}"
                f" ({free} free, {promised} already promised): evicting it would"
                " shrink the gang below its size"
            )
    return None


class EvictNode(BaseAction[EvictParams], name="evict_node", destroys=True):
    """Take the node out of service through the eviction backend (budgeted)."""

    def act(self, ctx: ActionContext, params: EvictParams) -> StepResult:
        """Per node: check the rails, move it to draining and record the drain (an effect);
        wait until every drain has an outcome."""
        nodes = incident_nodes(ctx, params.target)
        if not nodes:
            return StepResult(StepStatus.FAILED, {"error": "no node to evict"})
        if ctx.dry_run:  # shadow: the rails are judged as for real, nothing is drained
            for node in nodes:
                row = ctx.store.node(node)
                refusal = (
                    None
                    if row is not None and row.state in OUT_OF_SERVICE
                    else (_budget_refusal(ctx, node) or _replacement_refusal(ctx, node))
                )
                if refusal:
                    return StepResult(
                        StepStatus.ESCALATE,
                        {"node": node, "reason": refusal, "dry_run": "would escalate"},
                    )
            return StepResult(
                StepStatus.DONE,
                {
                    "nodes": nodes,
                    "backend": ctx.backend.name,
                    "did": [f"dry-run: would evict {n}" for n in nodes],
                },
            )
        done: list[str] = []
        retry = _approved_again(ctx)
        for node in nodes:
            key, effect = latest_drain(ctx, node)
            if effect is not None and effect.state == EffectState.FAILED and retry:
                key, effect = _next_drain_key(key), None  # approved again: ask anew
            if effect is None:
                row = ctx.store.node(node)
                if row is not None and row.state == NodeState.EVICTED:  # an earlier repair's
                    did = f"{node} already evicted"
                else:
                    refusal = self.start(ctx, key, node, params.reason, params.adopt)
                    if refusal:
                        return StepResult(StepStatus.ESCALATE, {"node": node, "reason": refusal})
                    continue
            elif effect.state == EffectState.FAILED:  # the scheduler was not told: a person
                # decides (the node stays as it was; approving the run asks the scheduler again)
                error = str(effect.result.get("error", "the drain failed"))
                return StepResult(
                    StepStatus.ESCALATE, {"node": node, "backend": ctx.backend.name, "error": error}
                )
            elif effect.state == EffectState.INTENDED:
                continue
            else:
                did = str(effect.result.get("did", ""))
            done.append(did)
            if node not in ctx.plan.exclude:
                ctx.plan.exclude.append(node)
        if len(done) < len(nodes):
            return StepResult(StepStatus.WAIT, {"draining": nodes})
        return StepResult(
            StepStatus.DONE, {"nodes": nodes, "backend": ctx.backend.name, "did": done}
        )

    @staticmethod
    def start(
        ctx: ActionContext, key: str, node: str, reason: str, adopt: bool = False
    ) -> str | None:
        """Record the drain of `node` (effect `key`), or why the rails refuse it. The scheduler
        is told why and by which incident (`scheduler.drain_reason`)."""
        row = ctx.store.node(node)
        if not adopt and (row is None or row.state != NodeState.DRAINING):
            refusal = _budget_refusal(ctx, node) or _replacement_refusal(ctx, node)
            if refusal:
                return refusal
        if row is None:
            lifecycle.add_node(ctx.store, node, NodeState.ACTIVE, ctx.now)
        lifecycle.move(
            ctx.store,
            Entity.NODE,
            node,
            NodeState.DRAINING,
            ctx.now,
            ctx.who,
            reason,
            incident_id=ctx.incident.id,
            reason=reason,
        )
        lifecycle.intend_effect(
            ctx.store,
            key,
            EffectKind.EVICT,
            node,
            {"reason": scheduler.drain_reason(ctx.incident.id, reason), "adopt": adopt},
            ctx.incident.id,
            ctx.now,
        )
        return None


def latest_drain(ctx: ActionContext, node: str) -> tuple[str, EffectRow | None]:
    """This step's latest drain of `node`: its key and effect (None: not asked yet). The first
    is `<step>/evict:<node>`; each retry after a failed one adds `#N`."""
    key, effect = f"{ctx.key}/evict:{node}", None
    while (found := ctx.store.effect(key)) is not None:
        effect = found
        key = _next_drain_key(key)
    if effect is None:
        return key, None
    return effect.key, effect


def _next_drain_key(key: str) -> str:
    base, _, n = key.partition("#")
    return f"{base}#{int(n or 0) + 1}"


def _approved_again(ctx: ActionContext) -> bool:
    """The step escalated and its run was approved again: an operator asks for a new try."""
    step = ctx.store.step(ctx.key)
    return step is not None and step.state == StepState.ESCALATED


class SwapParams(ActionParams):
    required: bool = False  # True: no spare left escalates instead of running one node short


class SwapSpare(BaseAction[SwapParams], name="swap_spare"):
    """Map each node this run evicted to a free hot spare of the job."""

    def act(self, ctx: ActionContext, params: SwapParams) -> StepResult:
        missing = [
            n for n in ctx.plan.exclude if n not in ctx.plan.spare_map and not take_spare(ctx, n)
        ]
        if missing and params.required:
            return StepResult(StepStatus.ESCALATE, {"reason": f"no hot spare left for {missing}"})
        return StepResult(
            StepStatus.DONE, {"spare_map": ctx.plan.spare_map, "without_spare": missing}
        )


def take_spare(ctx: ActionContext, node: str) -> str | None:
    """Map `node` to a free hot spare of the job in the run's plan (and make it active); the
    spare, or None when none is left."""
    job = ctx.job()
    taken = set(ctx.plan.spare_map.values())
    free = (s for s in (job.status.spares if job else []) if s not in taken)
    spare = next((s for s in free if _is_free_spare(ctx, s)), None)
    if spare is None:
        return None
    ctx.plan.spare_map[node] = spare
    if not ctx.dry_run:
        lifecycle.add_node(ctx.store, spare, NodeState.SPARE, ctx.now)  # if unknown
        why = f"swapped in for {node}"
        lifecycle.move(
            ctx.store,
            Entity.NODE,
            spare,
            NodeState.ACTIVE,
            ctx.now,
            ctx.who,
            why,
            incident_id=ctx.incident.id,
            reason=why,
        )
    return spare


_JOBS_LIMIT = 10_000
