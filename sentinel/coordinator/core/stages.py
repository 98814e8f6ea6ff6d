"""A repair's stages: when each happened, from the fault's first signal to the new gang's first
step, so that an operator (and `/metrics`, the demo report, the goodput simulator) sees where a
restart's time went.

    detected → decided → drained → restart → relaunched → rendezvoused → checkpoint_loaded
             → first_step

The coordinator knows the first part from its own records (the incident's first event, the
run's steps); the rest only the new gang knows. Its trainer reports it once, after the first
step it trains (`rank.launch`, see `trainer_hooks.SentinelHooks.launched`), and the report is
matched to the repair whose restart it is: the job's newest live `resume` step started before
the new processes began. A launch with no such repair (the job's first, or one an operator
restarted by hand) records nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sentinel.coordinator.core.rows import RepairStagesRow, RunRow, StepRow
from sentinel.protocol import RankLaunchEvent, RankLaunchPayload

if TYPE_CHECKING:
    from sentinel.coordinator.core.store import StateStore

MILESTONES = (
    "detected",
    "decided",
    "drained",
    "restart",
    "relaunched",
    "rendezvoused",
    "checkpoint_loaded",
    "first_step",
)
# The stages `/metrics` observes from a relaunch, beside `decide` and one per step action:
# `rendezvous` (relaunched to rendezvoused), `checkpoint_load` (rendezvoused to loaded) and
# `first_step`, the restart end to end: from the restart ordered (the resume step started) to
# the new gang's first step done, the job training nothing meanwhile.
LAUNCH_STAGES = ("rendezvous", "checkpoint_load", "first_step")


def timeline(
    run: RunRow, detected_at: float, steps: list[StepRow], launch: RankLaunchPayload
) -> RepairStagesRow | None:
    """The repair's stages from its run's steps and the relaunch's report; None when the run
    holds no live resume step (nothing it relaunched)."""
    live = [s for s in steps if not s.dry_run]
    resume = next((s for s in live if s.action == "resume"), None)
    if resume is None:
        return None
    evict = next((s for s in live if s.action == "evict_node" and s.done_at is not None), None)
    rendezvoused = launch.main_at + launch.rendezvous_s
    return RepairStagesRow(
        run_id=run.id,
        incident_id=run.incident_id,
        playbook=run.playbook,
        detected_at=min(detected_at, live[0].started_at),
        decided_at=min(s.started_at for s in live),
        drained_at=evict.done_at if evict is not None else None,
        restart_at=resume.started_at,
        relaunched_at=launch.main_at,
        rendezvoused_at=rendezvoused,
        checkpoint_loaded_at=min(launch.ready_at, rendezvoused + launch.load_s),
        first_step_at=launch.first_step_at,
        resume_step=launch.resume_step,
    )


# The timeline cut into consecutive segments, each named for what fills it and ending at its
# milestone; they add up to the time from detection to the first step (the demo report and the
# goodput simulator's breakdown of a repair).
SEGMENTS = {
    "decide": "decided",
    "drain": "drained",
    "prepare": "restart",  # the steps between: swap a spare, choose the checkpoint, ...
    "relaunch": "relaunched",
    "rendezvous": "rendezvoused",
    "checkpoint_load": "checkpoint_loaded",
    "build_first_step": "first_step",  # the model, data and hooks built, the first step run
}


def milestones(row: RepairStagesRow) -> dict[str, float | None]:
    """Stage name -> when it happened (None: the repair had no such stage)."""
    return {name: getattr(row, f"{name}_at") for name in MILESTONES}


def segments(at: Mapping[str, float | None]) -> dict[str, float]:
    """Seconds in each segment of a timeline given as milestone -> time (`milestones`, or a
    stored row's `<milestone>_at` as the API serves it); a milestone the repair did not have
    (no drain) leaves its segment out, the next one starting where the last one ended."""
    out: dict[str, float] = {}
    prev = at.get("detected")
    for segment, milestone in SEGMENTS.items():
        t = at.get(milestone)
        if t is None or prev is None:
            continue
        out[segment] = round(max(0.0, t - prev), 3)
        prev = max(prev, t)
    return out


def launch_stage_seconds(row: RepairStagesRow) -> dict[str, float]:
    """The relaunch's stages, in seconds (`/metrics`' `repair_stage_seconds`)."""
    return {
        "rendezvous": max(0.0, row.rendezvoused_at - row.relaunched_at),
        "checkpoint_load": max(0.0, row.checkpoint_loaded_at - row.rendezvoused_at),
        "first_step": max(0.0, row.first_step_at - row.restart_at),
    }


def record_launch(store: StateStore, ev: RankLaunchEvent) -> RepairStagesRow | None:
    """Attach a new gang's launch report to the repair that relaunched it (inside ingest's
    transaction); None when it is no repair's relaunch."""
    job = ev.source.job
    if job is None:
        return None
    # A node speaks only for itself: for the jobs it runs (their gang or spares, the supervisor
    # says), never another job's repair.
    row = store.job(job)
    if row is None or ev.source.node not in (*row.status.nodes, *row.status.spares):
        return None
    found = store.relaunching_run(job, ev.payload.main_at)
    if found is None:
        return None
    run = store.run(found)
    if run is None:
        return None
    detected = store.first_event_ts(run.incident_id)
    detected_at = detected if detected is not None else run.created_at
    stages = timeline(run, detected_at, store.run_steps(run.id), ev.payload)
    if stages is not None:
        store.insert_repair_stages(stages)
    return stages
