"""The recovery model: what each interruption costs in detection, waiting and restart time.

`sentinel goodput` builds both models from its inputs (`inputs.py`): Sentinel's times measured
by the drills (`measurements.py`), the rest named assumptions. The figures below are Sentinel's
old defaults, now used only for a class a measurements file has no sample of (said so in the
output), and by the tests' and levers' default models:

Sentinel (issue 8's targets for the demo):
- hardware (`node`): detected within one agent collection (1 s) plus delivery to the
  coordinator → 5 s; a hot spare is swapped in by the playbook.
- software crash (`restart`): the supervisor sees the rank exit → 5 s.
- hang: the trainer's hang watchdog (assumed 60 s) + 10 s → 70 s, then a flight-recorder dump.
- SDC: the periodic recompute-diff spot check → assumed every 300 s of training.
- link: comm-wait straggler scoring over a few steps → 60 s.
- resume (restart from the last checkpoint, spare mapped in): 60 s for every class.

Baseline, no Sentinel: every interruption is noticed when the job times out (PyTorch's
10-minute NCCL watchdog, 600 s); a broken node is replaced by hand (no hot spares, 30 min);
the same 60 s restart; a fixed hourly checkpoint.

Both: a swapped-out node is repaired and returns to the spare pool after 12 h; both save the
same async DCP checkpoints, whose cost is derived in `checkpoint.py` (blocks training 1.04 s
per save, committed 2.8 s later for the reference trace's 405B model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from sentinel.exitcodes import InputError
from sentinel.inputs import read_json
from sentinel.lab.goodput.checkpoint import CheckpointSpec
from sentinel.lab.goodput.scaling import throughput
from sentinel.lab.goodput.trace import LLAMA3, FaultClass

# Demo fault kinds (DESIGN.md vocabulary) → the class whose times they measure. Kinds that do
# not interrupt the job (straggler, corrupt_batch) are accepted and ignored.
DEMO_KIND_CLASS: dict[str, FaultClass | None] = {
    "ecc_dbe": FaultClass.NODE,
    "xid": FaultClass.NODE,
    "thermal": FaultClass.NODE,
    "crash": FaultClass.RESTART,
    "hang": FaultClass.HANG,
    "sdc": FaultClass.SDC,
    "link_degraded": FaultClass.LINK,
    "config_drift": None,  # kept out by the burn-in before launch
    "straggler": None,
    "corrupt_batch": None,
}

SENTINEL_DETECT_S = {
    FaultClass.NODE: 5.0,
    FaultClass.RESTART: 5.0,
    FaultClass.HANG: 70.0,
    FaultClass.SDC: 300.0,
    FaultClass.LINK: 60.0,
}
RESUME_S = dict.fromkeys(FaultClass, 60.0)
JOB_TIMEOUT_S = 600.0
DEFAULT_CHECKPOINT = CheckpointSpec()
CHECKPOINT_COST_S = DEFAULT_CHECKPOINT.blocking_s(LLAMA3.gpus)
CHECKPOINT_COMMIT_LAG_S = DEFAULT_CHECKPOINT.commit_lag_s()


class RepairPath(StrEnum):
    """How a fault is repaired (`paths.py` says which class takes which)."""

    LIVE = "live"  # the replica holding it leaves; the others keep stepping; a spare joins
    WARM_RESTART = "warm_restart"  # every rank stops, the surviving processes stay alive
    RESTART = "restart"  # every rank process is started again (today's path)


@dataclass(frozen=True)
class LiveSpec:
    """The live path's times and the job's replicas (`scaling.py` says how they grow)."""

    # The survivors' stall when a replica leaves, as measured on the simulated fleet (its
    # detection included); at least the class's own detection at scale (no quorum changes before
    # the fault is known), then the cross-replica groups re-formed (`regroup_s`).
    stall_s: float
    regroup_s: float  # re-forming the cross-replica groups: at the fault, and again at the join
    join_s: float  # a spare in place -> its replica back at full width
    replicas: int
    microbatches: int  # per replica per step
    keep_batch: bool = True  # the survivors take over a missing replica's microbatches

    def throughput(self, missing: int) -> float:
        return throughput(self.replicas, missing, self.microbatches, self.keep_batch)

    def stall_for(self, detect_s: float) -> float:
        return max(self.stall_s, detect_s) + self.regroup_s


def full_stop_paths() -> dict[FaultClass, RepairPath]:
    return dict.fromkeys(FaultClass, RepairPath.RESTART)


@dataclass(frozen=True)
class RecoveryModel:
    name: str
    detect_s: dict[FaultClass, float]
    # Detection -> training resumed, for a class whose path stops every rank (restart, warm
    # restart), once its replacement node is in place.
    resume_s: dict[FaultClass, float]
    spares: int
    checkpoint_cost_s: float  # seconds each save blocks training
    checkpoint_interval_s: float | None  # None: Young/Daly from the trace's MTBF
    # Seconds after a save's blocking part until it is committed (an async write); a failure
    # in between rolls back to the save before.
    checkpoint_commit_lag_s: float = 0.0
    node_repair_s: float = 12 * 3600.0
    manual_replace_s: float = 1800.0
    sources: dict[str, str] = field(default_factory=dict)
    path: dict[FaultClass, RepairPath] = field(default_factory=full_stop_paths)
    live: LiveSpec | None = None  # None: no class can take the live path

    def path_of(self, cls: FaultClass) -> RepairPath:
        """The class's path; live only where the job has replicas to lose one of."""
        path = self.path[cls]
        if path == RepairPath.LIVE and (self.live is None or self.live.replicas < 2):
            return RepairPath.WARM_RESTART
        return path

    def replace(self, **changes: object) -> RecoveryModel:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def scale_detection(self, factor: float) -> RecoveryModel:
        return self.replace(detect_s={k: v * factor for k, v in self.detect_s.items()})


def sentinel_model(
    spares: int = 8,
    checkpoint_cost_s: float = CHECKPOINT_COST_S,
    checkpoint_commit_lag_s: float = CHECKPOINT_COMMIT_LAG_S,
) -> RecoveryModel:
    return RecoveryModel(
        name="sentinel",
        detect_s=dict(SENTINEL_DETECT_S),
        resume_s=dict(RESUME_S),
        spares=spares,
        checkpoint_cost_s=checkpoint_cost_s,
        checkpoint_interval_s=None,
        checkpoint_commit_lag_s=checkpoint_commit_lag_s,
        sources={"detect_s": "defaults (issue 8 targets)", "resume_s": "defaults (issue 8 target)"},
    )


def baseline_model(
    checkpoint_cost_s: float = CHECKPOINT_COST_S,
    checkpoint_commit_lag_s: float = CHECKPOINT_COMMIT_LAG_S,
) -> RecoveryModel:
    return RecoveryModel(
        name="baseline",
        detect_s=dict.fromkeys(FaultClass, JOB_TIMEOUT_S),
        resume_s=dict(RESUME_S),
        spares=0,
        checkpoint_cost_s=checkpoint_cost_s,
        checkpoint_interval_s=3600.0,
        checkpoint_commit_lag_s=checkpoint_commit_lag_s,
        sources={"detect_s": "job timeout (NCCL watchdog 600 s)", "resume_s": "same restart"},
    )


def _class_of(key: str, source: str) -> FaultClass | None:
    if key in DEMO_KIND_CLASS:
        return DEMO_KIND_CLASS[key]
    try:
        return FaultClass(key)
    except ValueError:
        known = sorted([*DEMO_KIND_CLASS, *FaultClass])
        raise InputError(
            f"{source}: unknown fault kind {key!r} (known: {', '.join(known)})"
        ) from None


def _times(data: dict[str, object], key: str, source: str) -> dict[FaultClass, float]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise InputError(f"{source}: {key}: expected an object {{kind: seconds}}")
    out: dict[FaultClass, float] = {}
    for kind, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise InputError(f"{source}: {key}.{kind}: expected seconds >= 0, got {value!r}")
        cls = _class_of(str(kind), source)
        if cls is not None:  # several kinds of one class: keep the slowest
            out[cls] = max(out.get(cls, 0.0), float(value))
    return out


DemoTimes = tuple[dict[FaultClass, float], dict[FaultClass, float]]  # detection, resume


def demo_times(data: object, source: str) -> DemoTimes:
    """`{"time_to_detect_s": {kind: s}, "time_to_resume_s": {kind: s}}` (a drill's goodput.json)
    as seconds per class."""
    if not isinstance(data, dict) or not ("time_to_detect_s" in data or "time_to_resume_s" in data):
        raise InputError(f"{source}: expected time_to_detect_s and/or time_to_resume_s objects")
    return _times(data, "time_to_detect_s", source), _times(data, "time_to_resume_s", source)


def load_demo_times(path: Path) -> DemoTimes:
    return demo_times(read_json(path, "a drill's goodput.json"), str(path))
