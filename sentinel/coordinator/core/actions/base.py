"""The action interface: small units a playbook step names, run by the engine.

An action runs synchronously in the coordinator's store thread, inside the step's transaction:
it reads and writes the store and never calls the outside world. An outside call is recorded as
an effect (`effects.py`) and the step waits for its outcome. An action must be idempotent: after
a crash between "started" and "done" the engine runs it again with the same idempotency key, so
an action checks before it redoes (an effect already recorded, a command id already queued).

An action states only what is its own: `class StopJob(BaseAction[StopParams], name="stop_job",
dry_run="would stop the job")` names it, types its parameters (the type argument is the model
the engine validates a step's `params` with) and says what a dry run reports instead of acting;
`act` does the step.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.core.effects import EvictionBackend
from sentinel.coordinator.core.rows import IncidentRow, JobRow, NewCommand, RunContext
from sentinel.coordinator.core.store import StateStore
from sentinel.protocol import CommandKind, RepairPlan

log = logging.getLogger("sentinel.coordinator.actions")


# Commands the training ranks carry out. They go to the job's supervisor and to the agent of
# each of its nodes: whichever channel the ranks listen on delivers them.
RANK_COMMANDS = frozenset({CommandKind.FR_DUMP, CommandKind.SDC_CHECK, CommandKind.CHECKPOINT_NOW})


class ActionParams(BaseModel):
    """An action's parameters: a playbook's misspelt key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class WaitParams(ActionParams):
    """An action that waits for an answer gives up after `timeout_s` (then fails or escalates)."""

    timeout_s: float = Field(default=120.0, gt=0)


class StepStatus(StrEnum):
    DONE = "done"
    WAIT = "wait"  # not yet: the engine calls the action again on a later tick
    FAILED = "failed"
    ESCALATE = "escalate"  # a safety rail said no: a person decides


@dataclass
class StepResult:
    status: StepStatus
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PendingEviction:
    """Another open repair of the job that will evict its incident's nodes before it resumes
    (`evicting`: an older one that is evicting them now, or has, and has not resumed yet)."""

    run_id: int
    incident_id: int
    nodes: tuple[str, ...]
    evicting: bool = False
    capturing: bool = False  # its `evidence` step is under way: its nodes' ranks still dump


@dataclass
class ActionContext:
    store: StateStore
    cfg: CoordinatorConfig
    backend: EvictionBackend
    now: float
    key: str
    who: str
    incident: IncidentRow
    context: RunContext  # the run's persisted state, shared by its steps
    dry_run: bool = False
    step_started_at: float = 0.0
    # The job's other open repairs that will evict a node (the engine knows their playbooks).
    others: Callable[[], list[PendingEviction]] = lambda: []

    @property
    def plan(self) -> RepairPlan:
        """The restart plan the run's steps build up."""
        return self.context.plan

    @property
    def job_id(self) -> str | None:
        return self.incident.job or None

    def job(self) -> JobRow | None:
        if self.job_id is None:
            return None
        return self.store.job(self.job_id)

    def waited_past(self, timeout_s: float) -> bool:
        """Whether this step has waited longer than `timeout_s` since it started."""
        return self.now - self.step_started_at > timeout_s

    def command_id(self, suffix: str = "") -> str:
        return f"{self.key}{suffix}".replace("/", "-")

    def issue_command(self, kind: CommandKind, args: dict[str, Any], suffix: str = "") -> str:
        """Queue a command for the incident's job; the idempotency key is its id, so a redo
        after a crash finds the command already there."""
        cid = self.command_id(suffix)
        if self.job_id is None:
            raise ValueError("this incident has no job to send a command to")
        targets = [(cid, "job", self.job_id)]
        if kind in RANK_COMMANDS:  # also to each node's agent, which relays it to its ranks
            job = self.job()
            nodes = job.status.nodes if job else []
            targets += [(f"{cid}@{node}", "node", node) for node in nodes]
        self.store.insert_commands(
            [
                NewCommand(i, k, t, kind.value, args, self.now, self.incident.id)
                for i, k, t in targets
            ]
        )
        return cid


P = TypeVar("P", bound=BaseModel)


class BaseAction(ABC, Generic[P]):
    """A playbook action; see the module's docstring for how one is declared."""

    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]]  # P, kept for the engine and the playbook checker
    # What a dry run reports instead of acting; None: `act` reads `ctx.dry_run` itself (it has
    # something to show first, such as the nodes it would evict).
    dry_run: ClassVar[str | None]
    # It ends rank processes or takes a node away, and with them the evidence of what happened:
    # a playbook runs `evidence` before its first such step (`playbooks.py` checks).
    destroys_evidence: ClassVar[bool]

    def __init_subclass__(
        cls, *, name: str, dry_run: str | None = None, destroys: bool = False, **kw: Any
    ) -> None:
        super().__init_subclass__(**kw)
        params = [get_args(b)[0] for b in cls.__dict__.get("__orig_bases__", ()) if _is_base(b)]
        if len(params) != 1:
            raise TypeError(f"{cls.__name__}: name its parameters model, BaseAction[ParamsModel]")
        cls.name, cls.Params, cls.dry_run = name, params[0], dry_run
        cls.destroys_evidence = destroys

    def run(self, ctx: ActionContext, params: P) -> StepResult:
        """The engine's entry: a dry run of an action that only acts stops at its note."""
        if ctx.dry_run and self.dry_run is not None:
            return StepResult(StepStatus.DONE, {"dry_run": self.dry_run})
        return self.act(ctx, params)

    @abstractmethod
    def act(self, ctx: ActionContext, params: P) -> StepResult:
        """Do (or check and finish) this step."""


def _is_base(base: object) -> bool:
    return get_origin(base) is BaseAction
