"""The action interface: small units a playbook step names, run by the engine.

An action runs synchronously in the coordinator's store thread. It must be idempotent: after a
crash between "started" and "done" the engine runs it again with the same idempotency key, so
an action checks before it redoes (a node already drained, a command id already queued).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.store import Store, dumps
from sentinel.protocol import CommandKind

log = logging.getLogger("sentinel.coordinator.actions")


# Commands the training ranks carry out. They go to the job's supervisor and to the agent of
# each of its nodes: whichever channel the ranks listen on delivers them.
RANK_COMMANDS = frozenset({CommandKind.FR_DUMP, CommandKind.SDC_CHECK, CommandKind.CHECKPOINT_NOW})


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepStatus(StrEnum):
    DONE = "done"
    WAIT = "wait"  # not yet: the engine calls the action again on a later tick
    FAILED = "failed"
    ESCALATE = "escalate"  # a safety rail said no: a person decides


@dataclass
class StepResult:
    status: StepStatus
    detail: dict[str, Any] = field(default_factory=dict)


class EvictionError(RuntimeError):
    """The scheduler could not be told (its command failed, timed out, or is missing)."""


class EvictionBackend(ABC):
    """Takes a node out of service where the scheduler looks (exclude file, Slurm, Kubernetes)."""

    name: ClassVar[str]

    @abstractmethod
    def evict(self, node: str, reason: str) -> str:
        """Idempotent; returns a short description of what was done."""

    def restore(self, node: str, reason: str) -> str:
        """Put an evicted node back in service (an operator's decision); idempotent."""
        raise EvictionError(f"the {self.name} backend cannot return nodes; do it by hand")


@dataclass
class ActionContext:
    store: Store
    cfg: CoordinatorConfig
    backend: EvictionBackend
    now: float
    key: str
    who: str
    incident: dict[str, Any]
    context: dict[str, Any]  # the run's persisted scratchpad, shared by its steps
    dry_run: bool = False
    step_started_at: float = 0.0

    @property
    def job_id(self) -> str | None:
        job = self.incident.get("job")
        return str(job) if job else None

    def job(self) -> dict[str, Any] | None:
        if self.job_id is None:
            return None
        return self.store.one("SELECT * FROM jobs WHERE id=?", (self.job_id,))

    def command_id(self, suffix: str = "") -> str:
        return f"{self.key}{suffix}".replace("/", "-")

    def issue_command(self, kind: CommandKind, args: dict[str, Any], suffix: str = "") -> str:
        """Queue a command for the incident's job; the idempotency key is its id, so a redo
        after a crash finds the command already there."""
        cid = self.command_id(suffix)
        if self.job_id is None:
            raise ValueError("this incident has no job to send a command to")
        rows = [(cid, "job", self.job_id)]
        if kind in RANK_COMMANDS:  # also to each node's agent, which relays it to its ranks
            job = self.job()
            nodes = job["status"].get("nodes", []) if job else []
            rows += [(f"{cid}@{node}", "node", node) for node in nodes]
        self.store.executemany(
            "INSERT OR IGNORE INTO commands (id, target_kind, target, kind, args, created_at,"
            " incident_id) VALUES (?,?,?,?,?,?,?)",
            [(*r, kind.value, dumps(args), self.now, self.incident["id"]) for r in rows],
        )
        return cid


class BaseAction(ABC):
    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    description: ClassVar[str] = ""

    @abstractmethod
    def run(self, ctx: ActionContext, params: BaseModel) -> StepResult:
        """Do (or check and finish) this step."""
