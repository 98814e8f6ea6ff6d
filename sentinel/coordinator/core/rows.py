"""What the store hands out and takes in: typed rows, one per table, and the typed JSON columns.

Rows are plain frozen dataclasses (a run is the exception: the engine advances it in place);
the JSON columns that carry structure have pydantic models (a job's last status, an incident's
detail, a run's context with its repair plan). No backend's row type crosses this line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sentinel.coordinator.core.states import (
    EffectState,
    IncidentState,
    NodeState,
    RunState,
    StepState,
)
from sentinel.protocol import JobState, JobStatusPayload, RepairPlan


class IncidentDetail(BaseModel):
    """What a repair needs to know beyond the incident's columns."""

    model_config = ConfigDict(extra="ignore")

    nodes: list[str] = Field(default_factory=list)  # nodes its events came from
    batch: int | None = None  # the offending batch (a loss spike's)
    suspect_since: int | None = None  # the first step whose state may be corrupt (SDC)


class ManualStep(BaseModel):
    """A step an operator queued through the API (`POST /v1/actions`)."""

    model_config = ConfigDict(extra="forbid")

    action: str
    params: dict[str, Any] = Field(default_factory=dict)


class RunContext(BaseModel):
    """A run's persisted state beyond its columns, shared by its steps."""

    model_config = ConfigDict(extra="forbid")

    plan: RepairPlan = Field(default_factory=RepairPlan)
    manual: list[ManualStep] | None = None  # the steps of an operator's one-off run
    who: str | None = None  # who queued a manual run (the steps act in their name)
    # Where a waiting step started from, by step key: the job's generation before a restart,
    # the newest checkpoint before a wait.
    marks: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """Read a context written before the plan was a model (schema version 3 and older)."""
        if not isinstance(data, dict) or not data or data.keys() & cls.model_fields.keys():
            return data
        plan = {
            "exclude": data.get("evicted", []),
            "spare_map": data.get("spare_map", {}),
            "culprits": data.get("culprit_nodes", []),
            "resume_before_step": data.get("resume_before_step"),
            "skip_batches": data.get("skip_batches", []),
            "lr_scale": data.get("lr_scale"),
        }
        marks = {k: int(v) for k, v in data.items() if ":" in k and isinstance(v, int)}
        return {"plan": plan, "manual": data.get("_steps"), "who": data.get("_who"), "marks": marks}


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    last_seen: float | None
    verdict: str | None
    state: NodeState
    state_changed_at: float | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    state: JobState
    generation: int
    last_heartbeat: float | None
    status: JobStatusPayload


@dataclass(frozen=True, slots=True)
class IncidentRow:
    id: int
    key: str
    fault: str
    target: str
    job: str | None
    state: IncidentState
    playbook: str | None
    opened_at: float
    updated_at: float
    first_step: int | None
    acknowledged_by: str | None
    detail: IncidentDetail


@dataclass(slots=True)
class RunRow:
    id: int
    incident_id: int
    playbook: str
    status: RunState
    step_index: int
    context: RunContext
    dry_run: bool
    created_at: float
    updated_at: float
    step_started_at: float | None


@dataclass(frozen=True, slots=True)
class DoneStepRow:
    """A step that finished (not a dry run), with its incident's fault: what the restart
    budget counts (`resume`) and what a node's blame history holds (`evict_node`)."""

    incident_id: int
    fault: str
    done_at: float | None
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StepRow:
    """One action of a run (the `actions` table)."""

    id: int
    key: str
    incident_id: int | None
    run_id: int | None
    action: str
    target: str | None
    params: dict[str, Any]
    state: StepState
    result: dict[str, Any]
    dry_run: bool
    who: str
    started_at: float
    done_at: float | None


@dataclass(frozen=True, slots=True)
class RepairStagesRow:
    """When each stage of one repair happened (wall-clock epochs; `repair_stages` table): a
    live run that relaunched its job, timed from the coordinator's records up to the restart
    and from the new gang's `rank.launch` report after it (`sentinel.coordinator.core.stages`)."""

    run_id: int
    incident_id: int
    playbook: str
    detected_at: float  # the incident's first event
    decided_at: float  # the run's first step started
    drained_at: float | None  # its evict_node step done (None: it evicted nothing)
    restart_at: float  # its resume step started: the restart ordered
    relaunched_at: float  # the new gang's processes running (the trainer's main)
    rendezvoused_at: float
    checkpoint_loaded_at: float
    first_step_at: float  # the new gang's first step done
    resume_step: int  # the step the new gang resumed at


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    ts: float
    who: str
    what: str
    why: str
    incident_id: int | None
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CommandRow:
    id: str
    target_kind: str
    target: str
    kind: str
    args: dict[str, Any]
    created_at: float
    delivered_at: float | None
    acked_at: float | None
    result: dict[str, Any] | None
    incident_id: int | None


@dataclass(frozen=True, slots=True)
class NewCommand:
    id: str
    target_kind: str  # "job" or "node"
    target: str
    kind: str
    args: dict[str, Any]
    created_at: float
    incident_id: int | None


@dataclass(frozen=True, slots=True)
class TokenRow:
    id: str
    hash: str
    role: str
    node: str | None
    job: str | None
    created_at: float
    revoked_at: float | None


@dataclass(frozen=True, slots=True)
class EffectRow:
    """An outside call a step asked for: recorded before it is made, settled after."""

    id: int
    key: str
    kind: str
    target: str
    args: dict[str, Any]
    state: EffectState
    attempts: int  # calls begun; above 0 with no outcome: ask the outside system first
    result: dict[str, Any]
    incident_id: int | None
    created_at: float
    done_at: float | None


@dataclass(frozen=True, slots=True)
class EventRow:
    """A stored event as an incident lists it (no payload)."""

    id: str
    kind: str
    node: str | None
    rank: int | None
    job: str | None
    ts: float


@dataclass(frozen=True, slots=True)
class StoredEvent(EventRow):
    """A stored event with its payload, for trigger counts and diagnoses."""

    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PruneResult:
    deleted: int
    after: int  # the arrival cursor to continue from
    backlog: bool  # older events may remain past the cursor


@dataclass(frozen=True, slots=True)
class BundleRow:
    """An incident's sealed evidence bundle (`core/bundle.py`, the `bundles` table)."""

    incident_id: int
    sha256: str
    manifest: dict[str, Any]
    data: bytes
    started_at: float  # the evidence step began
    captured_at: float  # the ranks' part was in (the repair went on)
    sealed_at: float


@dataclass(frozen=True, slots=True)
class IncidentView:
    """One incident with everything that happened to it (`GET /v1/incidents/{id}`)."""

    incident: IncidentRow
    events: list[EventRow] = field(default_factory=list)
    runs: list[RunRow] = field(default_factory=list)
    actions: list[StepRow] = field(default_factory=list)
    audit: list[AuditRow] = field(default_factory=list)
    stages: list[RepairStagesRow] = field(default_factory=list)
