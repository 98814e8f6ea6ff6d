"""The rules' precision corpus: labelled event streams, one YAML file each (`corpus/*.yaml`).

A stream is what a small fleet goes through for a while: what strikes which node's GPUs, and
when (the simulated GPUs' fault vocabulary, `sentinel.agent.nvml.sim`), what happens to the
processes (an agent or the coordinator restarted), and what should come of it. Its label says
whether anything should be repaired at all:

    description: Application XIDs on one node: the job's own errors, not the GPU's.
    label: benign                 # benign: nothing leaves service; fault: a node must
    fleet: {nodes: 4, gpus_per_node: 8, spares: 1}
    duration_s: 120
    events:
      - {t: 10, node: node-1, kind: xid, gpu: 3, xid: 13}
      - {t: 30, node: node-2, kind: agent_restart}
      - {t: 40, kind: coordinator_restart}
      - {t: 50, node: node-3, kind: scheduler_drain, reason: "fan replaced"}
    expect: []                    # the incidents that must open, e.g.
                                  # [{fault: gpu_hardware, target: node-1}, {fault:
                                  # rank_crash, target: job}]; any other is false

A benign stream may expect an incident that repairs without taking anything out of service (an
XID NVIDIA's catalog answers with "restart the application" restarts the job); no playbook may
evict, drain or stop anything in it (`playbooks.DESTRUCTIVE_ACTIONS`).

`sentinel rules score` replays every stream through the real agent rules and the real
coordinator (`replay.py`) and compares what they did with the label (`score.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sentinel.agent.nvml.sim import FAULT_KINDS, parse_fault
from sentinel.exitcodes import InputError
from sentinel.inputs import parse_yaml, read_text
from sentinel.protocol import EVENT_TYPES, Event, EventKind, format_validation_error

CORPUS_DIR = Path(__file__).resolve().parents[2] / "corpus"
# The bars the corpus holds the rules to: a playbook that evicts or stops acts only at or above
# MIN_PRECISION (`gate.py`); the fault streams' expected incidents are found at MIN_RECALL.
MIN_PRECISION = 0.99
MIN_RECALL = 0.95
# What happens to a process rather than to a GPU.
PROCESS_EVENTS = frozenset({"agent_restart", "coordinator_restart"})
# What someone else does in the scheduler (an administrator drains a node, with `reason`, or
# resumes one), seen by the coordinator's scheduler bridge.
SCHEDULER_EVENTS = frozenset({"scheduler_drain", "scheduler_resume"})
# What a rank or the job's supervisor says (`kind: event`, with `event`, `rank` and `payload`).
RANK_EVENT = "event"
RANK_EVENTS = frozenset(
    k.value for k in EventKind if k.value.startswith("rank.") and k != EventKind.RANK_LAUNCH
)
KINDS = FAULT_KINDS | PROCESS_EVENTS | SCHEDULER_EVENTS | {RANK_EVENT}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fleet(_Strict):
    nodes: int = Field(default=4, ge=1, le=512)
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    spares: int = Field(default=1, ge=0, le=64)
    # A scale-up: the last `joining` nodes' agents start at `join_at_s` (silent before, in no
    # job); the job runs on the others.
    joining: int = Field(default=0, ge=0)
    join_at_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _some_stay(self) -> Fleet:
        if self.joining >= self.nodes:
            raise ValueError(f"joining ({self.joining}) must leave the job a node of {self.nodes}")
        return self

    def node_names(self) -> list[str]:
        return [f"node-{i}" for i in range(self.nodes)]

    def job_nodes(self) -> list[str]:
        return self.node_names()[: self.nodes - self.joining]

    def joining_names(self) -> list[str]:
        return self.node_names()[self.nodes - self.joining :]

    def spare_names(self) -> list[str]:
        return [f"spare-{i}" for i in range(self.spares)]


class Happening(BaseModel):
    """One thing at `t` seconds: a simulated GPU fault on `node` (its other keys are the
    fault's, `sentinel.agent.nvml.sim`), or a process event."""

    model_config = ConfigDict(extra="allow", frozen=True)
    t: float = Field(ge=0)
    kind: str = Field(min_length=1)
    node: str | None = None

    def fault_line(self) -> dict[str, Any]:
        """The simulator's fault line (its keys past `t` and `node`)."""
        return {"kind": self.kind, **(self.model_extra or {})}

    def rank_event(self, job: str, ts: float) -> Event:
        """A `kind: event` happening as the protocol event a rank or supervisor sends."""
        extra = self.model_extra or {}
        source = {"node": self.node, "rank": extra.get("rank"), "job": job}
        doc = {"source": source, "payload": extra.get("payload", {}), "ts": ts}
        return cast(Event, EVENT_TYPES[EventKind(str(extra.get("event")))].model_validate(doc))

    @model_validator(mode="after")
    def _known(self) -> Happening:
        if self.kind == "coordinator_restart":
            return self
        if self.node is None:
            raise ValueError(f"{self.kind} needs the node it happens on")
        if self.kind not in KINDS:
            raise ValueError(f"kind: one of {sorted(KINDS)}, not {self.kind!r}")
        if self.kind == RANK_EVENT:
            extra = self.model_extra or {}
            if extra.get("event") not in RANK_EVENTS:
                raise ValueError(f"event: one of {sorted(RANK_EVENTS)}, not {extra.get('event')!r}")
            self.rank_event("job", 0.0)  # a ValidationError names the payload's field
        elif self.kind not in PROCESS_EVENTS | SCHEDULER_EVENTS:
            try:
                parse_fault(self.fault_line())
            except InputError as e:
                raise ValueError(str(e)) from None
        return self


class Expected(_Strict):
    fault: str = Field(min_length=1)  # the incident's fault (a playbook's `incident.fault`)
    target: str = Field(min_length=1)  # the node it is about, or `job` for a job-scoped one

    def matches(self, fault: str, target: str) -> bool:
        """Whether an incident of `fault` on `target` ("node-1", "job:NAME") is this one."""
        on = target.split(":", 1)[0] if target.startswith("job:") else target
        return fault == self.fault and on == self.target


class Stream(_Strict):
    name: str
    description: str = Field(min_length=1)
    label: Literal["benign", "fault"]
    fleet: Fleet = Fleet()
    duration_s: float = Field(default=120.0, gt=0, le=3600)
    events: list[Happening] = Field(min_length=1)
    expect: list[Expected] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Stream:
        if self.label == "fault" and not self.expect:
            raise ValueError(
                "a fault stream names the incidents it expects (expect: [{fault, target}])"
            )
        known = set(self.fleet.node_names() + self.fleet.spare_names())
        for i, h in enumerate(self.events):
            if h.node is not None and h.node not in known:
                raise ValueError(f"events.{i}: no node {h.node!r} in the fleet")
            if h.t >= self.duration_s:
                raise ValueError(f"events.{i}: t {h.t:g} is past duration_s {self.duration_s:g}")
            gpu = (h.model_extra or {}).get("gpu")
            if isinstance(gpu, int) and gpu >= self.fleet.gpus_per_node:
                raise ValueError(f"events.{i}: no GPU {gpu} on a node of the fleet")
        for i, e in enumerate(self.expect):
            if e.target != "job" and e.target not in known:
                raise ValueError(f"expect.{i}: target: no node {e.target!r} in the fleet (or job)")
        return self


def load_stream(path: Path) -> Stream:
    """One stream file; InputError naming the file and the field when it is not one."""
    doc = parse_yaml(read_text(path, "a rules-corpus stream"), str(path))
    if not isinstance(doc, dict):
        raise InputError(f"{path}: a stream is a mapping (description, label, events, ...)")
    try:
        return Stream.model_validate({"name": path.stem, **doc})
    except ValidationError as e:
        raise InputError(f"{path}: {format_validation_error(e)}") from None


def load_corpus(directory: Path) -> list[Stream]:
    """Every `*.yaml` in `directory`, by name; InputError when there are none."""
    if not directory.is_dir():
        raise InputError(f"{directory}: not a directory")
    streams = [load_stream(p) for p in sorted(directory.glob("*.yaml"))]
    if not streams:
        raise InputError(f"{directory}: no streams (*.yaml) in it")
    return streams
