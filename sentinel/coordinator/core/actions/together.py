"""Concurrent repairs of one job make one restart.

While one repair of a job waits (a straggler's, for the next checkpoint), another may restart
the job (an SDC's). Restarted without the first repair's node, the job would be restarted again
moments later for it. So a restart takes along every node another open repair of the same job
has decided to evict but does not evict yet (its playbook evicts its incident's node after the
step it is on, before a resume still ahead of it): the node is drained here, under this step, with the same rails, and leaves with this
restart, mapped to a free spare. The other repair's work is then done: it is closed as done by
this restart, audited with the reason, its incident mitigated. A repair still capturing its
evidence (`evidence` under way) is waited for first: the restart would end the very ranks whose
flight recorders it is collecting.
"""

from __future__ import annotations

from sentinel.coordinator.core import lifecycle
from sentinel.coordinator.core.actions.base import ActionContext, StepResult, StepStatus
from sentinel.coordinator.core.actions.eviction import EvictNode, latest_drain, nodes_of, take_spare
from sentinel.coordinator.core.states import (
    LIVE_RUNS,
    EffectState,
    Entity,
    IncidentState,
    NodeState,
    RunState,
    StepState,
    TransitionError,
)

TAKEN = "took:"  # a run's mark: another repair's run (by id) whose node this restart took


def take_along(ctx: ActionContext) -> StepResult | None:
    """Drain every node other open repairs of this job have decided to evict and map each to a
    free spare in this run's plan; a waiting result while a drain is under way, else None. A
    node the rails refuse stays with its own repair."""
    for other in ctx.others():
        if other.evicting:  # an older repair evicting its node now: its restart goes first
            return StepResult(StepStatus.WAIT, {"after_incident": other.incident_id})
        if other.capturing:  # taking its node now would end the ranks it is capturing
            return StepResult(StepStatus.WAIT, {"after_capture_of": other.incident_id})
        for node in other.nodes:
            if node in ctx.plan.exclude:
                continue
            key, effect = latest_drain(ctx, node)
            if effect is None:
                row = ctx.store.node(node)
                if row is None or row.state != NodeState.EVICTED:
                    why = f"sentinel: taken along from incident {other.incident_id}"
                    if EvictNode.start(ctx, key, node, why) is None:
                        return StepResult(StepStatus.WAIT, {"draining": node})
                    continue  # refused: the other repair goes its own way (and escalates)
            elif effect.state == EffectState.INTENDED:
                return StepResult(StepStatus.WAIT, {"draining": node})
            elif effect.state == EffectState.FAILED:
                continue
            ctx.plan.exclude.append(node)
            take_spare(ctx, node)
            ctx.context.marks[f"{TAKEN}{other.run_id}"] = other.incident_id
    return None


def close_taken(ctx: ActionContext, command: str) -> list[int]:
    """Close every repair whose node this restart took along as done by it; their runs."""
    closed = []
    for mark, incident_id in list(ctx.context.marks.items()):
        if not mark.startswith(TAKEN):
            continue
        run = ctx.store.run(int(mark.removeprefix(TAKEN)))
        incident = ctx.store.incident(incident_id)
        if run is None or incident is None or run.status not in LIVE_RUNS:
            continue
        nodes = ", ".join(nodes_of(incident))
        why = f"{nodes} left with the restart of incident {ctx.incident.id} ({command})"
        _close(ctx, run.id, run.status, run.step_index, incident_id, why)
        closed.append(run.id)
    return closed


def _close(
    ctx: ActionContext, run_id: int, status: RunState, step: int, incident_id: int, why: str
) -> None:
    def move(entity: Entity, key: str | int, state: StepState | RunState | IncidentState) -> None:
        lifecycle.move(
            ctx.store, entity, key, state, ctx.now, ctx.who, why, incident_id=incident_id
        )

    waiting = ctx.store.step(f"run{run_id}/step{step}")
    if waiting is not None and waiting.state == StepState.STARTED:
        move(Entity.STEP, waiting.key, StepState.DONE)
    if status == RunState.PENDING:
        move(Entity.RUN, run_id, RunState.RUNNING)
    move(Entity.RUN, run_id, RunState.DONE)
    for state in (IncidentState.ACTING, IncidentState.MITIGATED):
        try:
            move(Entity.INCIDENT, incident_id, state)
        except TransitionError:  # already past it (acting), or a person moved it: it stays
            continue
