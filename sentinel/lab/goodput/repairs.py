"""A repair's parts at a fleet's scale, per path, from the projection's inputs (`inputs.py`).

The drills measure a repair stage by stage on 8 CPU ranks (`sentinel.repair_stage_s.CLASS.*`):
the coordinator's decision and drain, the relaunch (interpreter, torch import), the rendezvous,
the checkpoint load and the build to the first step. At N ranks (`scaling.py` says how):

- restart (every rank process started again, today's path): decision and drain as measured;
  the relaunch of the slowest of the job's nodes; the measured rendezvous plus the
  communicator's growth with N; the checkpoint read from the shared tier (each rank's shard of
  a state sharded over every GPU, FSDP as Llama 3 trained); the build to the first step.
- warm restart: decision and drain; a new process only for a rank whose process is dead or
  stuck (its relaunch and build, one node: no gang to wait for); the communicator at N; the
  state loaded in process: the survivors from their host-memory copy of the last save (the
  async save's staging copy), the replacement's ranks their shard from a peer replica (in a
  job with replicas) or the shared tier, whichever is slower.
- live: the survivors' stall and the spare's join as measured on the simulated fleet
  (`benchmarks/recovery.py`), plus what grows with N: the cross-replica group re-formed (R
  ranks) at the fault and again at the join, the joining replica's own groups, and its state
  copied from a peer (the state's share of one replica's GPUs: HSDP keeps a full copy per
  replica).

A repair given whole (`--repair-s`, `--from-demo`, a measurements file without stages) is taken
as it is at any scale, said so by its source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sentinel.lab.goodput.model import RepairPath
from sentinel.lab.goodput.paths import new_process
from sentinel.lab.goodput.scaling import comm_growth_s, read_s, slowest_start_s, transfer_s
from sentinel.lab.goodput.trace import FaultClass

# The coordinator's recorded stages the projection reads (`sentinel.coordinator.core.stages`);
# the drills' checkpoint load is replaced by the read at the fleet's bandwidths.
CONTROL_STAGES = ("decide", "drain", "prepare")
MODEL_STAGES = (*CONTROL_STAGES, "relaunch", "rendezvous", "build_first_step")


@dataclass(frozen=True)
class Layout:
    """The job at `gpus`: its nodes, and its data-parallel replicas on the live path."""

    gpus: int
    gpus_per_node: int
    replica_gpus: int

    @classmethod
    def of(cls, values: Mapping[str, float], gpus: int) -> Layout:
        per_node = max(1, round(values["layout.gpus_per_node"]))
        replica = max(1, round(values["layout.replica_gpus"]))
        return cls(gpus, per_node, replica)

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def replicas(self) -> int:
        return self.gpus // self.replica_gpus


Parts = dict[str, float]


def whole_key(cls: FaultClass) -> str:
    return f"sentinel.resume_s.{cls}"


def stage_key(cls: FaultClass, stage: str) -> str:
    return f"sentinel.repair_stage_s.{cls}.{stage}"


def _stage(values: Mapping[str, float], cls: FaultClass, name: str) -> float:
    return values.get(stage_key(cls, name), 0.0)  # a repair without the stage (no drain)


def _state_bytes(values: Mapping[str, float]) -> float:
    return values["checkpoint.params"] * values["checkpoint.bytes_per_param"]


def _communicator_s(values: Mapping[str, float], cls: FaultClass, ranks: int) -> float:
    grown = comm_growth_s(ranks, values["scale.comm_s_per_krank"])
    return _stage(values, cls, "rendezvous") + grown


def _control_s(values: Mapping[str, float], cls: FaultClass) -> float:
    return sum(_stage(values, cls, name) for name in CONTROL_STAGES)


def restart_parts(values: Mapping[str, float], cls: FaultClass, lay: Layout) -> Parts:
    if whole_key(cls) in values:
        return {"repair, given whole": values[whole_key(cls)]}
    shard = _state_bytes(values) / lay.gpus
    start = slowest_start_s(_stage(values, cls, "relaunch"), lay.nodes, values["scale.start_tail"])
    return {
        "decision and drain": _control_s(values, cls),
        "process start, slowest node": start,
        "communicator setup, every rank": _communicator_s(values, cls, lay.gpus),
        "checkpoint read, shared tier": read_s(
            shard, lay.gpus, values["scale.read_gbps"], values["checkpoint.storage_tbps"]
        ),
        "build to the first step": _stage(values, cls, "build_first_step"),
    }


def warm_parts(
    values: Mapping[str, float], cls: FaultClass, lay: Layout, replicated: bool
) -> Parts:
    """`replicated`: the job keeps a full copy of the state per replica (the live path's
    layout), so a replacement takes its shard from a peer rather than the shared tier."""
    if whole_key(cls) in values:
        return {"repair, given whole": values[whole_key(cls)]}
    shard = _state_bytes(values) / (lay.replica_gpus if replicated else lay.gpus)
    fetch = values["scale.peer_gbps"] if replicated else values["scale.read_gbps"]
    fresh = _stage(values, cls, "relaunch") + _stage(values, cls, "build_first_step")
    return {
        "decision and drain": _control_s(values, cls),
        "new process for the faulty rank": fresh if new_process(cls) else 0.0,
        "communicator setup, every rank": _communicator_s(values, cls, lay.gpus),
        "state load in process": max(
            transfer_s(shard, values["checkpoint.staging_gbps"]), transfer_s(shard, fetch)
        ),
    }


def full_stop_parts(
    values: Mapping[str, float], cls: FaultClass, path: RepairPath, lay: Layout, replicated: bool
) -> Parts:
    """The repair of a path that stops every rank (a class on the live path in a job too small
    to lose a replica takes the warm restart); `replicated`: the live configuration's layout."""
    if path == RepairPath.RESTART:
        return restart_parts(values, cls, lay)
    return warm_parts(values, cls, lay, replicated)


def trainer_restart_s(values: Mapping[str, float], lay: Layout) -> float:
    """Today's restart without Sentinel's decision and drain: the baseline's, for every class
    (the trainer's own restart, the node class's measured stages)."""
    parts = restart_parts(values, FaultClass.NODE, lay)
    return sum(parts.values()) - parts.get("decision and drain", 0.0)


@dataclass(frozen=True)
class LiveParts:
    stall: Parts  # the survivors' stall when a replica leaves (at least its detection)
    join: Parts  # a spare in place -> its replica stepping at full width
    regroup: Parts  # the cross-replica groups re-formed: at the fault, and again at the join


def live_parts(values: Mapping[str, float], lay: Layout) -> LiveParts:
    regroup = {
        "cross-replica groups re-formed": comm_growth_s(
            lay.replicas, values["scale.comm_s_per_krank"]
        )
    }
    shard = _state_bytes(values) / lay.replica_gpus
    return LiveParts(
        stall={"on the simulated fleet (live.stall_s)": values["live.stall_s"], **regroup},
        join={
            "on the simulated fleet (live.join_s)": values["live.join_s"],
            "the replica's own groups": comm_growth_s(
                lay.replica_gpus, values["scale.comm_s_per_krank"]
            ),
            "state from a peer replica": transfer_s(shard, values["scale.peer_gbps"]),
            **regroup,
        },
        regroup=regroup,
    )
