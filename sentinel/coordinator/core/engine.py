"""The playbook engine: runs steps as a persisted state machine (tables in lifecycle.py).

Each step is an `actions` row keyed `run<id>/step<i>`: "started" is committed before the action
runs, "done" is committed in the same transaction as what the action wrote (commands, node
state, the run's context). After kill -9 the engine finds a step "started" and runs it again;
actions are idempotent (checked before redone), so nothing happens twice.

An action with an outside effect (a drain, a notification) records it as an intent and waits;
`effects.py` makes the call outside any transaction and records the outcome, and the step
reads it on a later pass. Within `tick`, a coordinator's engine never calls the outside world.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core import bundle, lifecycle
from sentinel.coordinator.core.actions import ACTIONS, ActionContext, StepResult
from sentinel.coordinator.core.actions import StepStatus as St
from sentinel.coordinator.core.actions.base import PendingEviction
from sentinel.coordinator.core.actions.eviction import nodes_of
from sentinel.coordinator.core.effects import Effects, EvictionBackend
from sentinel.coordinator.core.playbooks import Playbook, Step
from sentinel.coordinator.core.rows import IncidentRow, RunContext, RunRow
from sentinel.coordinator.core.states import (
    ENDED_JOBS,
    LIVE_RUNS,
    Entity,
    IncidentState,
    RunState,
    StepState,
    TransitionError,
)
from sentinel.coordinator.core.store import StateStore
from sentinel.protocol import JobState

log = logging.getLogger("sentinel.coordinator.engine")

_STEP_END = {
    St.FAILED: (RunState.FAILED, IncidentState.FAILED),
    St.ESCALATE: (RunState.ESCALATED, IncidentState.ESCALATED),
}
_STEP_STATE = {
    St.DONE: StepState.DONE,
    St.WAIT: StepState.STARTED,
    St.FAILED: StepState.FAILED,
    St.ESCALATE: StepState.ESCALATED,
}
EFFECT_ROUNDS = 8  # inline effects: passes of effects and steps within one tick, at most


@dataclass(frozen=True)
class _ManualBook:
    """A one-off run an operator queued through the API (its steps live in the run)."""

    name: str
    steps: list[Step]


class Engine:
    """Advances runs. `inline_effects`: make recorded outside calls within `tick` (tests and
    tools driving the engine by hand); the coordinator's service makes them itself, off the
    store thread."""

    def __init__(
        self,
        store: StateStore,
        playbooks: list[Playbook],
        cfg: CoordinatorConfig,
        backend: EvictionBackend,
        clock: Callable[[], float],
        inline_effects: bool = True,
    ) -> None:
        self.store = store
        self.playbooks = {p.name: p for p in playbooks}
        self.cfg = cfg
        self.backend = backend
        self.clock = clock
        self.effects = Effects(store, backend)
        self.inline_effects = inline_effects

    def tick(self) -> int:
        """Advance every live run as far as it goes now; returns the number of steps finished."""
        finished = self._advance_all()
        if self.inline_effects:
            for _ in range(EFFECT_ROUNDS):
                if not self.effects.run_inline(self.clock):
                    break
                finished += self._advance_all()
        return finished

    def _advance_all(self) -> int:
        now = self.clock()
        self._check_jobs(now)
        finished = sum(self._advance(run, now) for run in self.store.runs(LIVE_RUNS))
        bundle.seal_due(self.store, now)  # evidence gathered beside the repairs
        return finished

    # --- runs --------------------------------------------------------------------------------

    def _book(self, run: RunRow) -> Playbook | _ManualBook | None:
        if run.playbook == "manual":
            steps = [Step.model_validate(s.model_dump()) for s in run.context.manual or []]
            return _ManualBook("manual", steps)
        return self.playbooks.get(run.playbook)

    def _advance(self, run: RunRow, now: float) -> int:
        if self.store.state_of(Entity.RUN, run.id) != run.status:
            return 0  # closed since this tick read it (done by another repair's restart)
        book = self._book(run)
        if book is None:
            self._end(
                run, RunState.FAILED, IncidentState.FAILED, now, f"playbook {run.playbook} gone"
            )
            return 0
        if run.status == RunState.PENDING:
            with self.store.tx():
                self._set_run(
                    run,
                    RunState.RUNNING,
                    now,
                    "incident matched the playbook",
                    what="run.start",
                    who=f"playbook:{book.name}",
                )
                if not run.dry_run:  # a shadow run acts on nothing, its incident included
                    self._set_incident(run.incident_id, IncidentState.ACTING, now)
        finished = 0
        while run.step_index < len(book.steps):
            result = self._step(run, book, now)
            if result.status == St.DONE:
                finished += 1
                continue
            if result.status == St.WAIT:
                return finished
            run_state, inc_state = _STEP_END[result.status]
            self._end(run, run_state, inc_state, now, str(result.detail))
            return finished
        self._end(run, RunState.DONE, IncidentState.MITIGATED, now, "every step done")
        return finished

    def _step(self, run: RunRow, book: Playbook | _ManualBook, now: float) -> StepResult:
        index = run.step_index
        step = book.steps[index]
        key = f"run{run.id}/step{index}"
        who = run.context.who or f"playbook:{book.name}"
        row = self.store.step(key)
        if row is None:
            with self.store.tx():
                lifecycle.start_step(
                    self.store,
                    key,
                    run.incident_id,
                    run.id,
                    step.action,
                    step.params,
                    run.dry_run,
                    who,
                    now,
                )
                run.step_started_at = now
                self.store.save_run(run, now)
        elif row.state == StepState.DONE:
            run.step_index = index + 1
            return StepResult(St.DONE, row.result)
        return self.execute(run, key, who, step.action, step.params, now)

    def execute(
        self,
        run: RunRow,
        key: str,
        who: str,
        action: str,
        params: dict[str, object],
        now: float,
    ) -> StepResult:
        """Run one action; commit its result, its writes and the run's context together."""
        incident = self.store.incident(run.incident_id)
        assert incident is not None
        impl = ACTIONS[action]
        context_before = run.context.model_copy(deep=True)
        with self.store.tx():
            ctx = ActionContext(
                store=self.store,
                cfg=self.cfg,
                backend=self.backend,
                now=now,
                key=key,
                who=who,
                incident=incident,
                context=run.context,
                dry_run=run.dry_run,
                step_started_at=run.step_started_at or now,
                others=lambda: self._others(run, incident),
            )
            try:
                with self.store.tx():
                    result = impl.run(ctx, impl.Params.model_validate(params))
            except Exception as e:  # an action that breaks fails its step, not the engine
                log.exception("action %s failed", action)
                result = StepResult(St.FAILED, {"error": f"{type(e).__name__}: {e}"})
            if not self._waits_as_before(run, key, incident, result, context_before):
                self._record_step(run, key, who, action, incident, result, now)
        return result

    def _waits_as_before(
        self,
        run: RunRow,
        key: str,
        incident: IncidentRow,
        result: StepResult,
        context_before: RunContext,
    ) -> bool:
        """Whether the step waits just as it did on the last pass (the same answer, the run's
        context untouched): then there is nothing to record, and the tick's transaction writes
        nothing. A step waiting on a slow effect (a 20 s drain) is passed every tick; a write
        each time was a commit to disk each tick on the store thread, which the ingest path's
        acknowledgements queue behind."""
        if (
            result.status != St.WAIT
            or run.status != RunState.WAITING
            or run.context != context_before
        ):
            return False
        row = self.store.step(key)
        return (
            row is not None
            and row.state == StepState.STARTED
            and row.result == result.detail
            and row.target == incident.target
        )

    def _record_step(
        self,
        run: RunRow,
        key: str,
        who: str,
        action: str,
        incident: IncidentRow,
        result: StepResult,
        now: float,
    ) -> None:
        state = _STEP_STATE[result.status]
        done_at = None if result.status == St.WAIT else now
        self.store.save_step_result(key, result.detail, incident.target, done_at)
        if result.status != St.WAIT or self.store.state_of(Entity.STEP, key) != state:
            lifecycle.move(
                self.store,
                Entity.STEP,
                key,
                state,
                now,
                who,
                f"{state}: {book_reason(incident)}",
                incident_id=incident.id,
                what=f"action.{action}",
                detail={"dry_run": run.dry_run, **result.detail},
            )
        if result.status == St.DONE:
            run.step_index += 1
        if result.status == St.WAIT and run.status == RunState.RUNNING:
            self._set_run(run, RunState.WAITING, now, "a step waits")
        elif result.status != St.WAIT and run.status == RunState.WAITING:
            self._set_run(run, RunState.RUNNING, now, "the waiting step finished")
        self.store.save_run(run, now)

    def _end(self, run: RunRow, state: RunState, inc: IncidentState, now: float, why: str) -> None:
        """End the run; its incident follows, unless the run was a shadow (dry) run: that one
        recorded what it would have done and leaves the incident open for whoever acts."""
        with self.store.tx():
            self._set_run(run, state, now, why, who=f"playbook:{run.playbook}")
            if not run.dry_run:
                self._set_incident(run.incident_id, inc, now)

    def _set_run(
        self,
        run: RunRow,
        new: RunState,
        now: float,
        why: str,
        what: str | None = None,
        who: str = "engine",
    ) -> None:
        lifecycle.move(
            self.store,
            Entity.RUN,
            run.id,
            new,
            now,
            who,
            why,
            incident_id=run.incident_id,
            what=what,
            detail={"dry_run": run.dry_run},
        )
        run.status = new

    def _set_incident(self, incident_id: int, new: IncidentState, now: float) -> None:
        try:
            lifecycle.move(
                self.store,
                Entity.INCIDENT,
                incident_id,
                new,
                now,
                "engine",
                "its run moved",
                incident_id=incident_id,
            )
        except TransitionError as e:  # e.g. an operator resolved it while the run went on
            log.info("incident %s stays: %s", incident_id, e)

    def _others(self, run: RunRow, incident: IncidentRow) -> list[PendingEviction]:
        """The job's other open repairs that have decided to evict their incident's nodes but
        do something else first (a straggler's waits for the next checkpoint), a resume still
        ahead of them: what a restart of this run takes along. One whose eviction is its
        current step, or behind it, evicts, and restarts, on its own; when it is older than
        this run, this run's restart waits for that one's (`evicting`), so that it is not sent
        with the node still in the job."""
        found = []
        for other in self.store.runs(LIVE_RUNS):
            book = self._book(other)
            if other.incident_id == run.incident_id or other.dry_run or book is None:
                continue
            here, ahead = book.steps[other.step_index :], book.steps[other.step_index + 1 :]
            evicts = any(_evicts(s) for s in ahead)
            evicting = (
                other.id < run.id
                and not evicts
                and any(_evicts(s) for s in book.steps[: other.step_index + 1])
            )
            theirs = self.store.incident(other.incident_id)
            resumes = any(s.action == "resume" for s in (here if evicting else ahead))
            if not (evicts or evicting) or not resumes or theirs is None:
                continue
            if theirs.job is not None and theirs.job == incident.job:
                nodes = tuple(nodes_of(theirs))
                capturing = bool(here) and here[0].action == "evidence"
                found.append(PendingEviction(other.id, theirs.id, nodes, evicting, capturing))
        return found

    # --- jobs --------------------------------------------------------------------------------

    def _check_jobs(self, now: float) -> None:
        """A supervisor that stopped heartbeating (killed) leaves its job visibly `lost`."""
        limit = now - self.cfg.job_heartbeat_timeout_s
        for job in self.store.silent_jobs(limit, ENDED_JOBS):
            with self.store.tx():
                lifecycle.move(
                    self.store,
                    Entity.JOB,
                    job.id,
                    JobState.LOST,
                    now,
                    "coordinator",
                    f"no supervisor heartbeat for {now - (job.last_heartbeat or 0):.0f} s",
                    what="job.lost",
                    detail={"job": job.id},
                )


def book_reason(incident: IncidentRow) -> str:
    return f"incident {incident.id} ({incident.fault} on {incident.target})"


def _evicts(step: Step) -> bool:
    """A playbook step that evicts its incident's node."""
    return step.action == "evict_node" and step.params.get("target", "incident") == "incident"
