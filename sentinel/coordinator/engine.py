"""The playbook engine: runs steps as a persisted state machine.

Run states and moves (one place, tested):
  awaiting_approval -> pending (operator approves) | cancelled
  pending -> running -> waiting <-> running -> done | failed | escalated ; any -> cancelled

Each step is an `actions` row keyed `run<id>/step<i>`: "started" is committed before the action
runs, "done" is committed in the same transaction as what the action wrote (commands, node
state, the run's context). After kill -9 the engine finds a step "started" and runs it again;
actions are idempotent (checked before redone), so nothing happens twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.actions import ACTIONS, ActionContext, EvictionBackend, StepResult
from sentinel.coordinator.actions import StepStatus as St
from sentinel.coordinator.incidents import IncidentState, TransitionError, check_transition
from sentinel.coordinator.playbooks import Playbook, Step
from sentinel.coordinator.store import Store, dumps

log = logging.getLogger("sentinel.coordinator.engine")


class RunState(StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    ESCALATED = "escalated"
    CANCELLED = "cancelled"


R = RunState
RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    R.AWAITING_APPROVAL: frozenset({R.PENDING, R.CANCELLED}),
    R.PENDING: frozenset({R.RUNNING, R.CANCELLED}),
    R.RUNNING: frozenset({R.WAITING, R.DONE, R.FAILED, R.ESCALATED, R.CANCELLED}),
    R.WAITING: frozenset({R.RUNNING, R.DONE, R.FAILED, R.ESCALATED, R.CANCELLED}),
    R.DONE: frozenset(),
    R.FAILED: frozenset(),
    R.ESCALATED: frozenset({R.PENDING, R.CANCELLED}),  # an operator may retry after fixing
    R.CANCELLED: frozenset(),
}
LIVE_RUNS = (R.PENDING, R.RUNNING, R.WAITING)
_STEP_END = {
    St.FAILED: (R.FAILED, IncidentState.FAILED),
    St.ESCALATE: (R.ESCALATED, IncidentState.ESCALATED),
}


@dataclass(frozen=True)
class _ManualBook:
    """A one-off run an operator queued through the API (its steps live in the run)."""

    name: str
    steps: list[Step]


def check_run_transition(current: RunState, new: RunState) -> None:
    if new not in RUN_TRANSITIONS[current]:
        raise ValueError(f"a playbook run cannot move {current} -> {new}")


class Engine:
    def __init__(
        self,
        store: Store,
        playbooks: list[Playbook],
        cfg: CoordinatorConfig,
        backend: EvictionBackend,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.playbooks = {p.name: p for p in playbooks}
        self.cfg = cfg
        self.backend = backend
        self.clock = clock

    def tick(self) -> int:
        """Advance every live run as far as it goes now; returns the number of steps finished."""
        now = self.clock()
        self._check_jobs(now)
        finished = 0
        marks = ",".join("?" * len(LIVE_RUNS))
        for run in self.store.query(
            f"SELECT * FROM runs WHERE status IN ({marks}) ORDER BY id", tuple(LIVE_RUNS)
        ):
            finished += self._advance(run, now)
        return finished

    # --- runs --------------------------------------------------------------------------------

    def _book(self, run: dict[str, Any]) -> Playbook | _ManualBook | None:
        if run["playbook"] == "manual":
            steps = [Step.model_validate(s) for s in run["context"].get("_steps", [])]
            return _ManualBook("manual", steps)
        return self.playbooks.get(run["playbook"])

    def _advance(self, run: dict[str, Any], now: float) -> int:
        book = self._book(run)
        if book is None:
            self._end(run, R.FAILED, IncidentState.FAILED, now, f"playbook {run['playbook']} gone")
            return 0
        if run["status"] == R.PENDING:
            with self.store.tx():
                self._set_run(run, R.RUNNING, now)
                self._set_incident(run["incident_id"], IncidentState.ACTING, now)
                self.store.audit(
                    now,
                    f"playbook:{book.name}",
                    "run.start",
                    "incident matched the playbook",
                    run["incident_id"],
                    {"run": run["id"], "dry_run": bool(run["dry_run"])},
                )
        finished = 0
        while run["step_index"] < len(book.steps):
            result = self._step(run, book, now)
            if result.status == St.DONE:
                finished += 1
                continue
            if result.status == St.WAIT:
                return finished
            run_state, inc_state = _STEP_END[result.status]
            self._end(run, run_state, inc_state, now, str(result.detail))
            return finished
        final = IncidentState.OPEN if run["dry_run"] else IncidentState.MITIGATED
        self._end(run, R.DONE, final, now, "every step done")
        return finished

    def _step(self, run: dict[str, Any], book: Playbook | _ManualBook, now: float) -> StepResult:
        index = run["step_index"]
        step = book.steps[index]
        key = f"run{run['id']}/step{index}"
        who = run["context"].get("_who") or f"playbook:{book.name}"
        row = self.store.one("SELECT * FROM actions WHERE key=?", (key,))
        if row is None:
            with self.store.tx():
                self.store.execute(
                    "INSERT INTO actions (key, incident_id, run_id, action, params, state,"
                    " dry_run, who, started_at) VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        key,
                        run["incident_id"],
                        run["id"],
                        step.action,
                        dumps(step.params),
                        "started",
                        run["dry_run"],
                        who,
                        now,
                    ),
                )
                self.store.execute("UPDATE runs SET step_started_at=? WHERE id=?", (now, run["id"]))
            run["step_started_at"] = now
        elif row["state"] == "done":
            run["step_index"] = index + 1
            return StepResult(St.DONE, row["result"])
        return self.execute(run, key, who, step.action, step.params, now)

    def execute(
        self,
        run: dict[str, Any],
        key: str,
        who: str,
        action: str,
        params: dict[str, Any],
        now: float,
    ) -> StepResult:
        """Run one action; commit its result, its writes and the run's context together."""
        incident = self.store.one("SELECT * FROM incidents WHERE id=?", (run["incident_id"],))
        assert incident is not None
        impl = ACTIONS[action]
        with self.store.tx():
            ctx = ActionContext(
                store=self.store,
                cfg=self.cfg,
                backend=self.backend,
                now=now,
                key=key,
                who=who,
                incident=incident,
                context=run["context"],
                dry_run=bool(run["dry_run"]),
                step_started_at=run.get("step_started_at") or now,
            )
            try:
                with self.store.tx():
                    result = impl.run(ctx, impl.Params.model_validate(params))
            except Exception as e:  # an action that breaks fails its step, not the engine
                log.exception("action %s failed", action)
                result = StepResult(St.FAILED, {"error": f"{type(e).__name__}: {e}"})
            state = {
                St.DONE: "done",
                St.WAIT: "started",
                St.FAILED: "failed",
                St.ESCALATE: "escalated",
            }[result.status]
            self.store.execute(
                "UPDATE actions SET state=?, result=?, target=?, done_at=? WHERE key=?",
                (
                    state,
                    dumps(result.detail),
                    incident["target"],
                    None if result.status == St.WAIT else now,
                    key,
                ),
            )
            if result.status == St.DONE:
                run["step_index"] += 1
            if result.status == St.WAIT and run["status"] == R.RUNNING:
                self._set_run(run, R.WAITING, now)
            elif result.status != St.WAIT and run["status"] == R.WAITING:
                self._set_run(run, R.RUNNING, now)
            self.store.execute(
                "UPDATE runs SET step_index=?, context=?, updated_at=? WHERE id=?",
                (run["step_index"], dumps(run["context"]), now, run["id"]),
            )
            if result.status != St.WAIT:
                self.store.audit(
                    now,
                    who,
                    f"action.{action}",
                    f"{state}: {book_reason(incident)}",
                    incident["id"],
                    {"key": key, "dry_run": bool(run["dry_run"]), **result.detail},
                )
        return result

    def _end(
        self, run: dict[str, Any], state: RunState, inc: IncidentState, now: float, why: str
    ) -> None:
        with self.store.tx():
            self._set_run(run, state, now)
            self._set_incident(run["incident_id"], inc, now)
            self.store.audit(
                now,
                f"playbook:{run['playbook']}",
                f"run.{state}",
                why,
                run["incident_id"],
                {"run": run["id"]},
            )

    def _set_run(self, run: dict[str, Any], new: RunState, now: float) -> None:
        check_run_transition(RunState(run["status"]), new)
        self.store.execute(
            "UPDATE runs SET status=?, updated_at=? WHERE id=?", (new, now, run["id"])
        )
        run["status"] = new

    def _set_incident(self, incident_id: int, new: IncidentState, now: float) -> None:
        row = self.store.one("SELECT state FROM incidents WHERE id=?", (incident_id,))
        if row is None or row["state"] == new:
            return
        try:
            check_transition(IncidentState(row["state"]), new)
        except TransitionError as e:  # e.g. an operator resolved it while the run went on
            log.info("incident %s stays %s: %s", incident_id, row["state"], e)
            return
        self.store.execute(
            "UPDATE incidents SET state=?, updated_at=? WHERE id=?", (new, now, incident_id)
        )
        log.info(
            "incident %s: %s -> %s", incident_id, row["state"], new, extra={"incident": incident_id}
        )

    # --- jobs --------------------------------------------------------------------------------

    def _check_jobs(self, now: float) -> None:
        """A supervisor that stopped heartbeating (killed) leaves its job visibly `lost`."""
        limit = now - self.cfg.job_heartbeat_timeout_s
        for job in self.store.query(
            "SELECT id, last_heartbeat FROM jobs WHERE state NOT IN ('finished','failed','lost')"
            " AND last_heartbeat < ?",
            (limit,),
        ):
            with self.store.tx():
                self.store.execute("UPDATE jobs SET state='lost' WHERE id=?", (job["id"],))
                self.store.audit(
                    now,
                    "coordinator",
                    "job.lost",
                    f"no supervisor heartbeat for {now - job['last_heartbeat']:.0f} s",
                    None,
                    {"job": job["id"]},
                )


def book_reason(incident: dict[str, Any]) -> str:
    return f"incident {incident['id']} ({incident['fault']} on {incident['target']})"
