"""The wire protocol: versioned JSON messages shared by every part of Sentinel.

Every message carries the protocol version `v`. An event has a unique `id` (ingest is idempotent
by it), a `source` (node, rank, job), a `kind`, a timestamp and a payload whose shape depends on
the kind. Commands flow the other way (coordinator -> agent/supervisor -> ranks).

This module is imported by training processes (through `trainer_hooks`), so it depends on
pydantic and the standard library only.
"""

from __future__ import annotations

import json
import secrets
import time
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar, cast, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

PROTOCOL_VERSION: Literal[1] = 1
SUPPORTED_VERSIONS = frozenset({1})
MAX_BATCH_EVENTS = 10_000
# The largest gang a job may report: a million ranks, past any fleet built. Bounded because
# the coordinator walks a job's ranks (who has not answered a stacks request).
MAX_WORLD_SIZE = 1 << 20

_M = TypeVar("_M", bound=BaseModel)

Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")]


class ProtocolError(ValueError):
    """A message that cannot be accepted; `str(err)` is the precise reason for the sender."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- verdict vocabulary (agent health rules, coordinator incidents) -------------------------


class Verdict(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


class Action(StrEnum):
    """Recommended action, ordered from least to most disruptive."""

    NONE = "none"
    RESTART_JOB = "restart_job"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    DRAIN_AND_INSPECT = "drain_and_inspect"


class Recovery(StrEnum):
    """How a repair brings the job back, from least to most disruptive (the fault catalog's
    repair table, `sentinel.faults.repairs`, says which a fault takes)."""

    LIVE = "live"  # the struck replica leaves; the others keep stepping; a spare joins
    WARM_RESTART = "warm_restart"  # every rank stops; surviving processes reload in process
    RESTART = "restart"  # every rank gets a new process


ACTION_SEVERITY = {a: i for i, a in enumerate(Action)}
VERDICT_SEVERITY = {v: i for i, v in enumerate(Verdict)}


# --- event payloads, one model per kind ------------------------------------------------------


class Finding(_Strict):
    """One reason behind a verdict: which rule fired and what it saw."""

    rule: str
    verdict: Verdict
    action: Action
    detail: str


class GpuVerdict(_Strict):
    """A GPU's verdict that changed, and why."""

    gpu: int = Field(ge=0)
    uuid: str | None = None
    verdict: Verdict
    previous: Verdict | None = None
    action: Action
    findings: list[Finding] = Field(default_factory=list)


class XidReport(_Strict):
    """An XID the driver reported, as the agent judged it (`action`: the catalog's, or
    drain_and_inspect once it repeated `repeats_in_window` times where the catalog escalates)."""

    gpu: int = Field(ge=0)
    uuid: str | None = None
    xid: int = Field(ge=0)
    name: str
    action: Action
    repeats_in_window: int = Field(default=1, ge=1)


class NodeHealthPayload(_Strict):
    """What changed on a node, in one event: the XIDs of this pass, the GPUs whose verdict moved,
    and the node's verdict after them (`previous`: the one its last health event carried), with
    every finding behind it (a GPU's detail starts with `gpu N:`)."""

    verdict: Verdict
    previous: Verdict | None = None
    action: Action
    unhealthy_gpus: list[int] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    gpus: list[GpuVerdict] = Field(default_factory=list)
    xids: list[XidReport] = Field(default_factory=list)


class AgentHeartbeatPayload(_Strict):
    gpus: int = Field(ge=0)
    verdict: Verdict
    agent_version: str
    spooled_events: int = Field(default=0, ge=0)


# A fingerprint's bounds: field names like `gpu.0.vbios` or `env.NCCL_IB_HCA`.
FINGERPRINT_FIELD = r"^[A-Za-z0-9_.:-]{1,128}$"
MAX_FINGERPRINT_FIELDS = 512
MAX_FINGERPRINT_VALUE = 256
FingerprintField = Annotated[str, Field(pattern=FINGERPRINT_FIELD)]


class AgentFingerprintPayload(_Strict):
    """The node's configuration fingerprint (`sentinel.fingerprint`), sent when the agent starts,
    when it changes, and every `agent.fingerprint_every_s` (so that it outlives retention)."""

    fields: dict[FingerprintField, Annotated[str, Field(max_length=MAX_FINGERPRINT_VALUE)]] = Field(
        max_length=MAX_FINGERPRINT_FIELDS
    )


# Training-rank and job events (trainer hooks, job supervisor): what a playbook needs to
# decide, plus optional fields an operator can read.


class RankAnomalyPayload(_Strict):
    """A loss or grad-norm anomaly seen by a rank; `anomaly` is "spike", "nan" or "inf"."""

    step: int = Field(ge=0)
    metric: str = "loss"
    anomaly: str
    value: float | None = None
    baseline: float | None = None
    batch: int | None = Field(default=None, ge=0)
    threshold: float | None = None


class RankHangPayload(_Strict):
    """A rank made no progress for longer than its hang timeout. `observer`: who saw it, the
    rank's own watchdog or its node's agent from outside (the rank's beacon, sentinel/beacon.py:
    a rank stopped or wedged holding the GIL cannot report itself), which then gives the
    process's state from /proc (`T (stopped)`, `R (running)`) and the share of a core it used
    while stalled."""

    step: int | None = Field(default=None, ge=0)
    waited_s: float = Field(ge=0)
    collective: str | None = None
    timeout_s: float | None = Field(default=None, ge=0)
    dump_path: str | None = None
    observer: Literal["rank", "agent"] = "rank"
    process_state: str | None = Field(default=None, max_length=200)
    cpu_share: float | None = Field(default=None, ge=0)  # of a core, over the stall (agent)


class RankSdcPayload(_Strict):
    """A digest of a recomputed piece of work; ranks that should agree and do not point at SDC."""

    step: int = Field(ge=0)
    digest: str
    check_id: str | None = None
    mismatch: bool = False
    check: str = "matmul"
    mismatched_ranks: list[int] = Field(default_factory=list)
    # On a mismatch: the first step after the last check that every rank passed. State from
    # this step on may hold the corruption (a rollback goes to a checkpoint before it).
    suspect_since: int | None = Field(default=None, ge=0)


class RankStragglerPayload(_Strict):
    """The source rank computes `slowdown` times slower than the gang's median, persistently."""

    step: int | None = Field(default=None, ge=0)
    slowdown: float = Field(gt=0)
    window: int | None = Field(default=None, ge=1)
    compute_s: float | None = Field(default=None, ge=0)
    median_compute_s: float | None = Field(default=None, ge=0)


class RankStepPayload(_Strict):
    """Per-rank step metrics (sent every N steps); fields a rank cannot measure are null."""

    step: int = Field(ge=0)
    step_s: float = Field(ge=0)
    compute_s: float = Field(ge=0)
    comm_s: float = Field(ge=0)
    tokens_per_s: float | None = Field(default=None, ge=0)
    tflops: float | None = Field(default=None, ge=0)
    mfu: float | None = Field(default=None, ge=0)
    loss: float | None = None
    grad_norm: float | None = None
    mem_bytes: int | None = Field(default=None, ge=0)
    hook_errors: int = Field(default=0, ge=0)
    dropped_events: int = Field(default=0, ge=0)


class RankCheckpointPayload(_Strict):
    """A checkpoint the job can resume from is complete (committed) at `step`.

    `blocked_s`: the seconds this save held up training (starting it, and waiting for its
    staging copy), where the trainer measures it; `path`: where it lies.
    """

    step: int = Field(ge=0)
    blocked_s: float | None = Field(default=None, ge=0)
    path: str | None = None


class RankLaunchPayload(_Strict):
    """A new gang's start-up, sent once per launch by one rank after its first step: where a
    repair's relaunch spent its time. Wall-clock epochs and seconds as the trainer measured
    them: its code ran from `main_at`, the rendezvous (process group) took `rendezvous_s`, the
    checkpoint load `load_s`, the first step began at `ready_at` (after the model, data and
    hooks were built) and ended at `first_step_at`."""

    main_at: float = Field(ge=0, allow_inf_nan=False)
    rendezvous_s: float = Field(ge=0, allow_inf_nan=False)
    load_s: float = Field(ge=0, allow_inf_nan=False)
    ready_at: float = Field(ge=0, allow_inf_nan=False)
    first_step_at: float = Field(ge=0, allow_inf_nan=False)
    resume_step: int = Field(ge=0)  # the first step the gang trained (0: a fresh start)

    @model_validator(mode="after")
    def _ordered(self) -> RankLaunchPayload:
        if not self.main_at <= self.ready_at <= self.first_step_at:
            raise ValueError("needs main_at <= ready_at <= first_step_at")
        return self


# The reason of a rank's second dump for an incident's evidence: its buffer again, each entry
# with the stack it was issued from, in the file named as the plain dump plus this suffix.
WITH_STACKS = "command, with stack traces"
WITH_STACKS_SUFFIX = ".stacks"


class RankFrDumpPayload(_Strict):
    """A rank wrote its flight-recorder buffer; `reason` is command, hang, signal or manual
    (or `WITH_STACKS`)."""

    step: int | None = Field(default=None, ge=0)
    path: str
    reason: str
    entries: int | None = Field(default=None, ge=0)
    check_id: str | None = None  # the `fr.dump` command's check, quoted back


# A rank's answer to `stacks.dump` is bounded, so one answer fits the agent's 1 MiB line:
MAX_STACK_THREADS = 64  # threads per rank (the rest are counted in `threads_left_out`)
MAX_STACK_FRAMES = 64  # frames per thread, the innermost kept (the rest: `frames_left_out`)


class StackFrame(_Strict):
    """One frame of a Python stack, as `traceback` shows it."""

    file: str = Field(max_length=512)
    line: int | None = Field(default=None, ge=0)
    func: str = Field(max_length=256)
    code: str = Field(default="", max_length=512)


class ThreadStack(_Strict):
    """One thread's stack, outermost frame first (a traceback's "most recent call last")."""

    name: str = Field(max_length=256)
    daemon: bool = False
    frames: list[StackFrame] = Field(max_length=MAX_STACK_FRAMES)
    frames_left_out: int = Field(default=0, ge=0)


class RankStacksPayload(_Strict):
    """A rank's Python stacks, every thread, answering the `stacks.dump` named `request_id`."""

    request_id: Identifier
    pid: int = Field(ge=0)
    step: int | None = Field(default=None, ge=0)
    threads: list[ThreadStack] = Field(max_length=MAX_STACK_THREADS)
    threads_left_out: int = Field(default=0, ge=0)


class RankCrashPayload(_Strict):
    """A rank process ended abnormally (reported by the supervisor that launched it).

    `checkpoint`: the newest committed checkpoint when it died; `resumed_from`: the checkpoint
    its generation started from. `no_progress` is set (true) when the supervisor can tell that
    the generation committed no checkpoint before the crash: a crash that comes back before any
    progress looks the same on every node (a poison batch, a code bug), so it is not evidence
    against the node it happened on.
    """

    exit_code: int | None = None
    signal: int | None = None
    step: int | None = Field(default=None, ge=0)
    generation: int = Field(default=0, ge=0)
    reason: str | None = None
    checkpoint: int | None = Field(default=None, ge=0)
    resumed_from: int | None = Field(default=None, ge=0)
    no_progress: bool | None = None


class JobState(StrEnum):
    """Where a job stands. The supervisor reports every state but `lost`, which the
    coordinator sets when the supervisor's heartbeat stops (see coordinator/lifecycle.py)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    CRASHED = "crashed"
    FAILED = "failed"
    FINISHED = "finished"
    # a restart's plan would shrink the gang (no spare left): the job waits, visibly, for a
    # person to return or add nodes; it is never shrunk silently
    WAITING_FOR_NODES = "waiting_for_nodes"
    LOST = "lost"


class JobStatusPayload(_Strict):
    """The supervisor's heartbeat: where the job stands and what it runs on."""

    state: JobState
    generation: int = Field(ge=0)
    world_size: int = Field(ge=0, le=MAX_WORLD_SIZE)
    gpus_per_node: int = Field(default=1, ge=1)
    nodes: list[str] = Field(default_factory=list)
    spares: list[str] = Field(default_factory=list)
    step: int | None = Field(default=None, ge=0)
    checkpoints: list[int] = Field(default_factory=list)


class ValidationCheck(_Strict):
    """One check of a node's validation burn-in: its figure, the baseline's and the limit."""

    name: str = Field(min_length=1, max_length=64)  # "gemm", "sdc", "loopback"
    passed: bool
    value: float | None = None  # seconds or a ratio (gemm), GB/s or a ratio (loopback); None: sdc
    baseline: float | None = None
    limit: float | None = None
    detail: str = Field(default="", max_length=2000)


class NodeValidationPayload(_Strict):
    """A node's answer to `node.validate` (its agent ran the validation burn-in on it)."""

    request_id: Identifier
    passed: bool
    checks: list[ValidationCheck] = Field(default_factory=list, max_length=64)
    reason: str = Field(default="", max_length=4000)  # why it failed, for the incident
    seconds: float = Field(default=0.0, ge=0)
    # Where the burn-in ran: the agent's launcher (a process, a systemd unit, a Slurm job step)
    # and the host that answered.
    ran: str = Field(default="", max_length=200)


class SchedulerDrainPayload(_Strict):
    """The scheduler holds the node out of service, and Sentinel did not take it out (an
    administrator, a health-check script, a prolog): seen by the coordinator's scheduler
    bridge (`coordinator/core/scheduler.py`)."""

    state: str = Field(min_length=1, max_length=64)  # the scheduler's word: "DRAIN", "DOWN"...
    reason: str = Field(default="", max_length=500)  # the scheduler's reason, as it says it


class SchedulerResumePayload(_Strict):
    """A node Sentinel took out is back in service where the scheduler looks, without passing
    Sentinel's validation gate (someone resumed it): seen by the scheduler bridge."""

    state: str = Field(min_length=1, max_length=64)


class FrAnalysisPayload(_Strict):
    """Result of a flight-recorder dump analysis (`sentinel fr analyze`) for a job."""

    verdict: str
    culprit_ranks: list[int] = Field(default_factory=list)
    waiting_ranks: list[int] = Field(default_factory=list)
    check_id: str | None = None


class EventKind(StrEnum):
    NODE_HEALTH = "node.health"
    AGENT_HEARTBEAT = "agent.heartbeat"
    AGENT_FINGERPRINT = "agent.fingerprint"
    RANK_ANOMALY = "rank.anomaly"
    RANK_HANG = "rank.hang"
    RANK_SDC = "rank.sdc"
    RANK_STRAGGLER = "rank.straggler"
    RANK_CRASH = "rank.crash"
    JOB_STATUS = "job.status"
    FR_ANALYSIS = "fr.analysis"
    RANK_STEP = "rank.step"
    RANK_FR_DUMP = "rank.fr_dump"
    RANK_CHECKPOINT = "rank.checkpoint"
    RANK_STACKS = "rank.stacks"
    RANK_LAUNCH = "rank.launch"
    NODE_VALIDATION = "node.validation"
    # The coordinator's own view of the scheduler (its scheduler bridge), never a sender's.
    SCHEDULER_DRAIN = "scheduler.drain"
    SCHEDULER_RESUME = "scheduler.resume"


# --- envelopes -------------------------------------------------------------------------------


class Source(_Strict):
    """Who speaks. A node agent sets `node`; a training rank adds `rank` and `job`."""

    node: Identifier | None = None
    rank: int | None = Field(default=None, ge=0)
    job: Identifier | None = None

    @model_validator(mode="after")
    def _someone(self) -> Source:
        if self.node is None and self.job is None:
            raise ValueError("a source names at least a node or a job")
        return self


def new_id() -> str:
    """32 hex digits: milliseconds since the epoch, then 80 random bits (UUIDv7's layout).

    Ids from one sender sort by time, so the coordinator's id index grows at its right edge;
    random ids would dirty a different B-tree page for every event it stores.
    """
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


# Seconds since the epoch, checked by pydantic's core (no Python validator on the hot path).
Timestamp = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# Strict: `true` or `1.0` is no version (a literal 1 would take both). The supported versions
# are one range.
Version = Annotated[int, Field(strict=True, ge=min(SUPPORTED_VERSIONS), le=max(SUPPORTED_VERSIONS))]


class EventBase(_Strict):
    """What every event carries. A concrete event is one of the per-kind classes below, whose
    `kind` is a literal and whose `payload` is that kind's model: every rule lives in a field
    type, so pydantic's core checks a whole batch straight from the JSON bytes."""

    v: Version = PROTOCOL_VERSION
    id: Identifier = Field(default_factory=new_id)
    kind: EventKind
    source: Source
    ts: Timestamp = Field(default_factory=time.time)
    payload: BaseModel


class NodeHealthEvent(EventBase):
    kind: Literal[EventKind.NODE_HEALTH] = EventKind.NODE_HEALTH
    payload: NodeHealthPayload


class AgentHeartbeatEvent(EventBase):
    kind: Literal[EventKind.AGENT_HEARTBEAT] = EventKind.AGENT_HEARTBEAT
    payload: AgentHeartbeatPayload


class AgentFingerprintEvent(EventBase):
    kind: Literal[EventKind.AGENT_FINGERPRINT] = EventKind.AGENT_FINGERPRINT
    payload: AgentFingerprintPayload


class RankAnomalyEvent(EventBase):
    kind: Literal[EventKind.RANK_ANOMALY] = EventKind.RANK_ANOMALY
    payload: RankAnomalyPayload


class RankHangEvent(EventBase):
    kind: Literal[EventKind.RANK_HANG] = EventKind.RANK_HANG
    payload: RankHangPayload


class RankSdcEvent(EventBase):
    kind: Literal[EventKind.RANK_SDC] = EventKind.RANK_SDC
    payload: RankSdcPayload


class RankStragglerEvent(EventBase):
    kind: Literal[EventKind.RANK_STRAGGLER] = EventKind.RANK_STRAGGLER
    payload: RankStragglerPayload


class RankCrashEvent(EventBase):
    kind: Literal[EventKind.RANK_CRASH] = EventKind.RANK_CRASH
    # every field is optional: a supervisor may know nothing but that the rank ended
    payload: RankCrashPayload = Field(default_factory=RankCrashPayload)


class JobStatusEvent(EventBase):
    kind: Literal[EventKind.JOB_STATUS] = EventKind.JOB_STATUS
    payload: JobStatusPayload


class FrAnalysisEvent(EventBase):
    kind: Literal[EventKind.FR_ANALYSIS] = EventKind.FR_ANALYSIS
    payload: FrAnalysisPayload


class RankStepEvent(EventBase):
    kind: Literal[EventKind.RANK_STEP] = EventKind.RANK_STEP
    payload: RankStepPayload


class RankFrDumpEvent(EventBase):
    kind: Literal[EventKind.RANK_FR_DUMP] = EventKind.RANK_FR_DUMP
    payload: RankFrDumpPayload


class RankCheckpointEvent(EventBase):
    kind: Literal[EventKind.RANK_CHECKPOINT] = EventKind.RANK_CHECKPOINT
    payload: RankCheckpointPayload


class RankLaunchEvent(EventBase):
    kind: Literal[EventKind.RANK_LAUNCH] = EventKind.RANK_LAUNCH
    payload: RankLaunchPayload


class RankStacksEvent(EventBase):
    kind: Literal[EventKind.RANK_STACKS] = EventKind.RANK_STACKS
    payload: RankStacksPayload


class NodeValidationEvent(EventBase):
    kind: Literal[EventKind.NODE_VALIDATION] = EventKind.NODE_VALIDATION
    payload: NodeValidationPayload


class SchedulerDrainEvent(EventBase):
    kind: Literal[EventKind.SCHEDULER_DRAIN] = EventKind.SCHEDULER_DRAIN
    payload: SchedulerDrainPayload


class SchedulerResumeEvent(EventBase):
    kind: Literal[EventKind.SCHEDULER_RESUME] = EventKind.SCHEDULER_RESUME
    payload: SchedulerResumePayload


# Any event: the class its `kind` names. The one decoder of events (see `decode_event`).
Event = Annotated[
    NodeHealthEvent
    | AgentHeartbeatEvent
    | AgentFingerprintEvent
    | RankAnomalyEvent
    | RankHangEvent
    | RankSdcEvent
    | RankStragglerEvent
    | RankCrashEvent
    | JobStatusEvent
    | FrAnalysisEvent
    | RankStepEvent
    | RankFrDumpEvent
    | RankCheckpointEvent
    | RankStacksEvent
    | RankLaunchEvent
    | NodeValidationEvent
    | SchedulerDrainEvent
    | SchedulerResumeEvent,
    Field(discriminator="kind"),
]

# What the coordinator itself observes (its scheduler bridge): no token may report them, bar
# an administrator's (a replay, a test).
COORDINATOR_EVENTS = frozenset({EventKind.SCHEDULER_DRAIN, EventKind.SCHEDULER_RESUME})

EVENT_TYPES: dict[EventKind, type[EventBase]] = {
    cls.model_fields["kind"].default: cls for cls in get_args(get_args(Event)[0])
}
PAYLOAD_MODELS: dict[EventKind, type[BaseModel]] = {
    kind: cls.model_fields["payload"].annotation  # type: ignore[misc]
    for kind, cls in EVENT_TYPES.items()
}


class EventBatch(_Strict):
    v: Version = PROTOCOL_VERSION
    events: list[Event] = Field(max_length=MAX_BATCH_EVENTS)


class CommandKind(StrEnum):
    FR_DUMP = "fr.dump"
    SDC_CHECK = "sdc.check"
    CHECKPOINT_NOW = "checkpoint.now"
    JOB_STOP = "job.stop"
    JOB_RESTART = "job.restart"
    STACKS_DUMP = "stacks.dump"  # to a node's agent: its ranks answer with `rank.stacks`
    # To a node's agent: run the validation burn-in, answer with `node.validation`.
    NODE_VALIDATE = "node.validate"
    # To a node's agent: upload the node's evidence for an incident's bundle (its NVML
    # snapshot, XID history, kernel-log tail, recent verdicts) as `node-evidence.json` of the
    # check `args.check_id` (`PUT /v1/fr/{check}/{node}/node-evidence.json`).
    NODE_EVIDENCE = "node.evidence"


class LrScale(_Strict):
    """Scale the learning rate by `factor` for the first `steps` steps after a restart."""

    factor: float = Field(gt=0, le=1.0)
    steps: int = Field(ge=1)


class RepairPlan(BaseModel):
    """The decision a repair builds up for a restart, step by step (evict, swap, rollback,
    skip, LR scale), and the `job.restart` command's arguments: the coordinator's actions
    write it, the supervisor reads it, one model on both ends of the wire."""

    model_config = ConfigDict(extra="forbid")

    exclude: list[Identifier] = Field(default_factory=list)  # nodes taken out (evicted)
    spare_map: dict[Identifier, Identifier] = Field(default_factory=dict)  # out node -> spare
    culprits: list[Identifier] = Field(default_factory=list)  # nodes a diagnosis named
    # Nodes that stay in the gang but whose rank processes are replaced with new ones: the
    # fault left their device or memory untrusted (the fault catalog's `process: replace`).
    replace: list[Identifier] = Field(default_factory=list)
    # The fault's repair path and the paths it allows (the catalog's repair table): the
    # supervisor takes the one its job asks for if allowed, within what the job can do.
    path: Recovery = Recovery.WARM_RESTART
    paths: list[Recovery] = Field(default_factory=lambda: [Recovery.WARM_RESTART, Recovery.RESTART])
    resume_before_step: int | None = Field(default=None, ge=0)  # None: the newest checkpoint
    skip_batches: list[tuple[int, int]] = Field(default_factory=list)  # inclusive ranges
    lr_scale: LrScale | None = None
    reason: str = ""

    @field_validator("skip_batches")
    @classmethod
    def _ranges(cls, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        for lo, hi in ranges:
            if lo < 0 or hi < lo:
                raise ValueError(f"batch range {lo}-{hi} is not 0 <= first <= last")
        return ranges


class StopPlan(BaseModel):
    """The `job.stop` command's arguments: why, and which nodes' rank processes must not
    outlive the stop (a hang's culprits: their processes are stuck; the others may stay warm
    for the restart that follows)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = ""
    replace: list[Identifier] = Field(default_factory=list)


# Commands whose arguments have a model of their own; the others carry a small free dict.
COMMAND_ARGS: dict[CommandKind, type[BaseModel]] = {
    CommandKind.JOB_RESTART: RepairPlan,
    CommandKind.JOB_STOP: StopPlan,
}


class Command(_Strict):
    """An instruction from the coordinator, to a node agent, a job supervisor or its ranks."""

    v: Version = PROTOCOL_VERSION
    id: Identifier = Field(default_factory=new_id)
    kind: CommandKind
    target: Source
    ts: float = Field(default_factory=time.time)
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _args_fit_kind(self) -> Command:
        model = COMMAND_ARGS.get(self.kind)
        if model is not None:
            model.model_validate(self.args)
        return self


# --- decoding with precise errors ------------------------------------------------------------
# One decoder per message type: pydantic's core validates the JSON bytes against the models
# above (for an event, the discriminated union picks the kind's class). Only a message it
# refuses takes a second look, to say why as precisely as a sender needs: bad JSON, no object,
# a missing or unsupported version first, then every field error by its path.


def make_event(kind: EventKind, source: Source, payload: BaseModel, **kw: Any) -> Event:
    """An event of `kind`; `payload` must be that kind's model (a ValidationError otherwise)."""
    return cast(Event, EVENT_TYPES[kind](source=source, payload=payload, **kw))


_KIND_TAGS = frozenset(k.value for k in EventKind)


def format_validation_error(err: ValidationError) -> str:
    """`field.path: message` for every error, joined; what a sender needs to fix its message.

    An event's kind is the union's tag in pydantic's error path (`events.1.node.health.payload`);
    it is left out of the path and named after the message instead.
    """
    parts = []
    for e in err.errors():
        loc, kind = [], None
        for i, p in enumerate(e["loc"]):
            if p in _KIND_TAGS and (i == 0 or isinstance(e["loc"][i - 1], int)):
                kind = p
            else:
                loc.append(str(p))
        ctx = e.get("ctx", {})
        if e["type"] == "union_tag_invalid":
            loc.append("kind")
            msg = f"unknown event kind {ctx.get('tag')!r} (known: {', '.join(sorted(_KIND_TAGS))})"
        elif e["type"] == "union_tag_not_found":
            loc.append("kind")
            msg = "Field required"
        else:
            msg = e["msg"] + (f" (a {kind} event)" if kind else "")
        parts.append(f"{'.'.join(loc) or '(message)'}: {msg}")
    return "; ".join(parts)


def _envelope_refusal(raw: str | bytes | dict[str, Any]) -> ProtocolError | None:
    """Why a refused message is no message of this protocol at all, if it is not."""
    if isinstance(raw, dict):
        doc: object = raw
    else:
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return ProtocolError(f"not valid JSON: {e}")
        except RecursionError:  # nested deeper than any message is
            return ProtocolError("not valid JSON: nested too deeply")
    if not isinstance(doc, dict):
        return ProtocolError(f"expected a JSON object, got {type(doc).__name__}")
    version = doc.get("v")
    if version is None:
        return ProtocolError(_NO_VERSION)
    # A version is an integer; any other JSON value (an object, a list) is no version at all.
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or version not in SUPPORTED_VERSIONS
    ):
        return ProtocolError(
            f"unsupported protocol version {version!r} (this build speaks "
            f"{sorted(SUPPORTED_VERSIONS)})"
        )
    return None


_NO_VERSION = "missing protocol version field 'v'"


def _decode(adapter: TypeAdapter[_M], raw: str | bytes | dict[str, Any]) -> _M:
    try:
        if isinstance(raw, dict):
            message = adapter.validate_python(raw)
        else:
            message = adapter.validate_json(raw)
    except ValidationError as e:
        raise _envelope_refusal(raw) or ProtocolError(format_validation_error(e)) from None
    # Every message states its version; the models default it only for messages built here.
    if "v" not in message.model_fields_set:
        raise ProtocolError(_NO_VERSION)
    return message


_EVENT: TypeAdapter[Event] = TypeAdapter(Event)
_BATCH = TypeAdapter(EventBatch)
_COMMAND = TypeAdapter(Command)


def decode_event(raw: str | bytes | dict[str, Any]) -> Event:
    return _decode(_EVENT, raw)


def decode_batch(raw: str | bytes | dict[str, Any]) -> EventBatch:
    return _decode(_BATCH, raw)


def decode_command(raw: str | bytes | dict[str, Any]) -> Command:
    return _decode(_COMMAND, raw)


def encode(message: BaseModel) -> str:
    """Compact one-line JSON: what goes on a socket line or into a spool file."""
    return message.model_dump_json()


# --- rank registration on a node agent's socket ----------------------------------------------


class RankRegistration(_Strict):
    """A training rank telling its node's agent which GPU it owns: the agent labels that GPU's
    telemetry with the job and rank while the rank's connection is open. `gpu` is the NVML
    index; without it the agent finds the GPU whose NVML process list holds `pid`."""

    job: Identifier
    rank: int = Field(ge=0)
    gpu: int | None = Field(default=None, ge=0)
    pid: int | None = Field(default=None, ge=1)
    tp: int = Field(default=0, ge=0)  # the rank's coordinates in the tensor-, pipeline- and
    pp: int = Field(default=0, ge=0)  # data-parallel groups
    dp: int = Field(default=0, ge=0)
    # The rank's beacon (sentinel/beacon.py), for the agent's watchdog from outside; the agent
    # takes it only at the path of the connecting process's own pid and rank.
    beacon: str | None = Field(
        default=None, pattern=r"^/dev/shm/sentinel-beacon-\d{1,10}-\d{1,10}$"
    )


def encode_registration(reg: RankRegistration) -> str:
    """The registration's line on the rank socket: `{"v": 1, "register": {...}}`."""
    return json.dumps(
        {"v": PROTOCOL_VERSION, "register": reg.model_dump(exclude_none=True)},
        separators=(",", ":"),
    )
