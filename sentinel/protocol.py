"""The wire protocol: versioned JSON messages shared by every part of Sentinel.

Every message carries the protocol version `v`. An event has a unique `id` (ingest is idempotent
by it), a `source` (node, rank, job), a `kind`, a timestamp and a payload whose shape depends on
the kind. Commands flow the other way (coordinator -> agent/supervisor -> ranks).

This module is imported by training processes (through `trainer_hooks`), so it depends on
pydantic and the standard library only.
"""

from __future__ import annotations

import json
import math
import secrets
import time
import types
from enum import Enum, StrEnum
from typing import Annotated, Any, Literal, NotRequired, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from typing_extensions import TypedDict

PROTOCOL_VERSION: Literal[1] = 1
SUPPORTED_VERSIONS = frozenset({1})
MAX_BATCH_EVENTS = 10_000

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


ACTION_SEVERITY = {a: i for i, a in enumerate(Action)}
VERDICT_SEVERITY = {v: i for i, v in enumerate(Verdict)}


# --- event payloads, one model per kind ------------------------------------------------------


class Finding(_Strict):
    """One reason behind a verdict: which rule fired and what it saw."""

    rule: str
    verdict: Verdict
    action: Action
    detail: str


class GpuVerdictPayload(_Strict):
    gpu: int = Field(ge=0)
    uuid: str | None = None
    verdict: Verdict
    previous: Verdict | None = None
    action: Action
    findings: list[Finding] = Field(default_factory=list)


class NodeVerdictPayload(_Strict):
    verdict: Verdict
    previous: Verdict | None = None
    action: Action
    unhealthy_gpus: list[int] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)


class XidPayload(_Strict):
    gpu: int = Field(ge=0)
    uuid: str | None = None
    xid: int = Field(ge=0)
    name: str
    action: Action
    repeats_in_window: int = Field(default=1, ge=1)


class AgentHeartbeatPayload(_Strict):
    gpus: int = Field(ge=0)
    verdict: Verdict
    agent_version: str
    spooled_events: int = Field(default=0, ge=0)


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
    step: int | None = Field(default=None, ge=0)
    waited_s: float = Field(ge=0)
    collective: str | None = None
    timeout_s: float | None = Field(default=None, ge=0)
    dump_path: str | None = None


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


class RankFrDumpPayload(_Strict):
    """A rank wrote its flight-recorder buffer; `reason` is command, hang, signal or manual."""

    step: int | None = Field(default=None, ge=0)
    path: str
    reason: str
    entries: int | None = Field(default=None, ge=0)


class RankCrashPayload(_Strict):
    """A rank process ended abnormally (reported by the supervisor that launched it)."""

    exit_code: int | None = None
    signal: int | None = None
    step: int | None = Field(default=None, ge=0)
    generation: int = Field(default=0, ge=0)
    reason: str | None = None


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
    world_size: int = Field(ge=0)
    gpus_per_node: int = Field(default=1, ge=1)
    nodes: list[str] = Field(default_factory=list)
    spares: list[str] = Field(default_factory=list)
    step: int | None = Field(default=None, ge=0)
    checkpoints: list[int] = Field(default_factory=list)


class FrAnalysisPayload(_Strict):
    """Result of a flight-recorder dump analysis (`sentinel fr analyze`) for a job."""

    verdict: str
    culprit_ranks: list[int] = Field(default_factory=list)
    waiting_ranks: list[int] = Field(default_factory=list)
    check_id: str | None = None


class EventKind(StrEnum):
    GPU_VERDICT = "gpu.verdict"
    NODE_VERDICT = "node.verdict"
    GPU_XID = "gpu.xid"
    AGENT_HEARTBEAT = "agent.heartbeat"
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


PAYLOAD_MODELS: dict[EventKind, type[BaseModel]] = {
    EventKind.GPU_VERDICT: GpuVerdictPayload,
    EventKind.NODE_VERDICT: NodeVerdictPayload,
    EventKind.GPU_XID: XidPayload,
    EventKind.AGENT_HEARTBEAT: AgentHeartbeatPayload,
    EventKind.RANK_ANOMALY: RankAnomalyPayload,
    EventKind.RANK_HANG: RankHangPayload,
    EventKind.RANK_SDC: RankSdcPayload,
    EventKind.RANK_STRAGGLER: RankStragglerPayload,
    EventKind.RANK_CRASH: RankCrashPayload,
    EventKind.JOB_STATUS: JobStatusPayload,
    EventKind.FR_ANALYSIS: FrAnalysisPayload,
    EventKind.RANK_STEP: RankStepPayload,
    EventKind.RANK_FR_DUMP: RankFrDumpPayload,
    EventKind.RANK_CHECKPOINT: RankCheckpointPayload,
}


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


class Event(_Strict):
    v: Literal[1] = PROTOCOL_VERSION
    id: Identifier = Field(default_factory=new_id)
    kind: EventKind
    source: Source
    ts: float = Field(default_factory=time.time)
    # Checked even when absent: a kind whose payload has required fields needs one.
    payload: dict[str, Any] = Field(default_factory=dict, validate_default=True)

    @field_validator("ts")
    @classmethod
    def _finite(cls, ts: float) -> float:
        if not math.isfinite(ts) or ts < 0:
            raise ValueError("timestamp must be finite, in seconds since the epoch")
        return ts

    @field_validator("payload")
    @classmethod
    def _payload_matches_kind(cls, payload: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        kind = info.data.get("kind")
        if kind is None:  # the kind itself failed; that error is reported already
            return payload
        try:
            validated = PAYLOAD_MODELS[kind].model_validate(payload)
        except ValidationError as e:
            raise ValueError(f"not a valid {kind} payload: {format_validation_error(e)}") from None
        # Normalised (enums to values, defaults filled) so that equal events serialize equally.
        return validated.model_dump(mode="json")

    def __eq__(self, other: object) -> bool:
        """Equal fields make equal events, whichever per-kind class a decoder built."""
        if isinstance(other, Event):
            return self.__dict__ == other.__dict__
        return NotImplemented

    def typed_payload(self) -> BaseModel:
        return PAYLOAD_MODELS[self.kind].model_validate(self.payload)


class EventBatch(_Strict):
    v: Literal[1] = PROTOCOL_VERSION
    events: list[Event] = Field(max_length=MAX_BATCH_EVENTS)


class CommandKind(StrEnum):
    FR_DUMP = "fr.dump"
    SDC_CHECK = "sdc.check"
    CHECKPOINT_NOW = "checkpoint.now"
    JOB_STOP = "job.stop"
    JOB_RESTART = "job.restart"


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


# Commands whose arguments have a model of their own; the others carry a small free dict.
COMMAND_ARGS: dict[CommandKind, type[BaseModel]] = {CommandKind.JOB_RESTART: RepairPlan}


class Command(_Strict):
    """An instruction from the coordinator, to a node agent, a job supervisor or its ranks."""

    v: Literal[1] = PROTOCOL_VERSION
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


def make_event(kind: EventKind, source: Source, payload: BaseModel, **kw: Any) -> Event:
    return Event(kind=kind, source=source, payload=payload.model_dump(mode="json"), **kw)


def format_validation_error(err: ValidationError) -> str:
    """`field.path: message` for every error, joined; what a sender needs to fix its message."""
    parts = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(message)"
        parts.append(f"{path}: {e['msg']}")
    return "; ".join(parts)


def _load_json(raw: str | bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(raw, dict):
        doc: object = raw
    else:
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProtocolError(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"expected a JSON object, got {type(doc).__name__}")
    version = doc.get("v")
    if version is None:
        raise ProtocolError("missing protocol version field 'v'")
    # A version is an integer; any other JSON value (an object, a list) is no version at all.
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or version not in SUPPORTED_VERSIONS
    ):
        raise ProtocolError(
            f"unsupported protocol version {version!r} (this build speaks "
            f"{sorted(SUPPORTED_VERSIONS)})"
        )
    return doc


def _decode(model: type[_M], raw: str | bytes | dict[str, Any]) -> _M:
    doc = _load_json(raw)
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        raise ProtocolError(format_validation_error(e)) from None


# --- the fast path for well-formed wire events ------------------------------------------------
# `Event` checks its payload in a Python validator (the payload's model depends on a sibling
# field) that validates it and dumps it again: the coordinator's largest cost per batch. On the
# wire the same rules fit a discriminated union of one `Event` subclass per kind, whose payload
# is a TypedDict derived from the kind's model, so pydantic's core checks a whole batch straight
# from the JSON bytes and hands back plain dicts with defaults filled. Only a message that
# passes comes out of it; any other takes the path above, whose errors are precise.


def _as_typed_dict(model: type[BaseModel]) -> Any:
    """A TypedDict with `model`'s fields, constraints and defaults (nested models too)."""

    def plain(tp: Any) -> Any:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return _as_typed_dict(tp)
        if isinstance(tp, type) and issubclass(tp, Enum):
            # Its values as literal strings: checked in pydantic's core, where an enum field
            # would build an enum member and read its `.value` back in Python for every field.
            return Literal[tuple(m.value for m in tp)]
        origin, args = get_origin(tp), get_args(tp)
        if origin is None:
            return tp
        if origin in (Union, types.UnionType):
            return Union[tuple(plain(a) for a in args)]  # noqa: UP007
        if origin is list:
            return list[plain(args[0])]  # type: ignore[misc]
        return tp

    fields: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        parts: list[Any] = [plain(f.annotation), *f.metadata]
        if f.default_factory is not None:
            parts.append(Field(default_factory=f.default_factory))
        elif not f.is_required():
            parts.append(Field(default=f.default))
        annotated = Annotated[tuple(parts)] if len(parts) > 1 else parts[0]
        fields[name] = annotated if f.is_required() else NotRequired[annotated]
    typed = TypedDict(f"{model.__name__}Dict", fields)  # type: ignore[operator, misc]
    typed.__pydantic_config__ = ConfigDict(extra="forbid", use_enum_values=True)  # type: ignore[attr-defined]
    return typed


class _WireEvent(Event):
    """An `Event` whose kind-specific payload rules live in its field types, not validators."""

    ts: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(default_factory=time.time)

    # Same names as `Event`'s validators, so these run in their place: the field types have
    # checked everything already.
    @classmethod
    def _finite(cls, ts: float) -> float:
        return ts

    @classmethod
    def _payload_matches_kind(cls, payload: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return payload


def _wire_event(kind: EventKind) -> type[Event]:
    return create_model(  # type: ignore[no-any-return]
        f"{PAYLOAD_MODELS[kind].__name__.removesuffix('Payload')}Event",
        __base__=_WireEvent,
        kind=(Literal[kind], ...),  # type: ignore[valid-type, arg-type]
        payload=(
            _as_typed_dict(PAYLOAD_MODELS[kind]),
            Field(default_factory=dict, validate_default=True),
        ),
    )


# Built at import from the payload models: a value to pydantic, not a type to mypy.
_ANY_KIND: Any = Annotated[
    Union[tuple(_wire_event(k) for k in EventKind)],  # noqa: UP007
    Field(discriminator="kind"),
]
_WIRE_EVENT: TypeAdapter[Event] = TypeAdapter(_ANY_KIND)
_WIRE_BATCH: TypeAdapter[Any] = TypeAdapter(
    create_model(
        "WireBatch",
        __base__=_Strict,
        v=(Literal[1], ...),
        events=(list[_ANY_KIND], Field(max_length=MAX_BATCH_EVENTS)),  # type: ignore[valid-type]
    )
)


def decode_event(raw: str | bytes | dict[str, Any]) -> Event:
    if not isinstance(raw, dict):
        try:
            return _WIRE_EVENT.validate_json(raw)
        except ValidationError:
            pass
    return _decode(Event, raw)


def decode_batch(raw: str | bytes | dict[str, Any]) -> EventBatch:
    if not isinstance(raw, dict):
        try:
            wire = _WIRE_BATCH.validate_json(raw)
        except ValidationError:
            pass
        else:
            return EventBatch.model_construct(v=wire.v, events=wire.events)  # type: ignore[attr-defined]
    return _decode(EventBatch, raw)


def decode_command(raw: str | bytes | dict[str, Any]) -> Command:
    return _decode(Command, raw)


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


def encode_registration(reg: RankRegistration) -> str:
    """The registration's line on the rank socket: `{"v": 1, "register": {...}}`."""
    return json.dumps(
        {"v": PROTOCOL_VERSION, "register": reg.model_dump(exclude_none=True)},
        separators=(",", ":"),
    )
