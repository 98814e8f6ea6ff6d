"""One meaning per fault, for its repair: which path a fault takes and what becomes of the
process it struck.

Three repair paths, from least to most disruptive:

- `live`: the fault is confined to one data-parallel replica (a GPU, a node, a process in it).
  That replica leaves; the other replicas keep stepping, taking over its micro-batches; a warm
  spare joins at a step boundary with its state copied from a healthy peer. Nothing is rolled
  back. Only a job whose replicas are fault domains can take it.
- `warm_restart`: the fault touches every replica (corrupted state that the gradient all-reduce
  has spread: SDC, a loss spike; a hang that holds every replica in a collective). Every rank
  stops; the surviving rank processes stay alive, leave the generation's process groups and
  load state in process for the next one.
- `restart`: every rank gets a new process (today's stop-the-world restart), the path of a job
  whose ranks cannot stay warm.

The table is keyed by the incident's fault class (a playbook's `incident.fault`); the drill's
fault kinds name the classes that explain them (`KIND_FAULTS`). The coordinator puts a fault's
path and allowed paths in its restart plan; the supervisor takes the path the job asks for when
the fault allows it, and what the job can do (`sentinel.supervisor`); a scenario's `recovery:`
that a fault forbids is refused when the scenario loads (`sentinel.scenario`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sentinel.protocol import Recovery

_LIVE, _WARM, _COLD = Recovery.LIVE, Recovery.WARM_RESTART, Recovery.RESTART
_ANY = frozenset(Recovery)
_STOPS_ALL = frozenset({_WARM, _COLD})


@dataclass(frozen=True, slots=True)
class RepairInfo:
    fault: str  # the incident's fault class
    path: Recovery  # where the job can take it
    allowed: frozenset[Recovery]
    # What becomes of the struck node's rank processes if the node stays in the job: `keep`
    # (they may stay warm) or `replace` (their device or memory cannot be trusted again).
    process: Literal["keep", "replace"]
    why: str


# fmt: off
REPAIRS: tuple[RepairInfo, ...] = (
    RepairInfo("gpu_hardware", _LIVE, _ANY, "replace",
               "a failed GPU takes its replica only; its node leaves the job"),
    RepairInfo("gpu_job_fault", _LIVE, _ANY, "replace",
               "the XID broke one process's device context: its replica rejoins with new ones"),
    RepairInfo("thermal", _LIVE, _ANY, "keep",
               "one node's GPU: its replica leaves with the node"),
    RepairInfo("thermal_degraded", _LIVE, _ANY, "keep",
               "one node's GPU: its replica leaves with the node"),
    RepairInfo("straggler", _LIVE, _ANY, "keep",
               "one slow node holds back its replica only"),
    RepairInfo("scheduler_drain", _LIVE, _ANY, "keep",
               "the scheduler took one node out: its replica leaves with it"),
    RepairInfo("unvalidated_return", _LIVE, _ANY, "keep",
               "a node back in the scheduler without validation: no job's rank is touched"),
    RepairInfo("rank_crash", _WARM, _ANY, "keep",
               "the dead process is replaced; the rest restart warm from the last checkpoint"),
    RepairInfo("rank_crash_repeat", _WARM, _ANY, "keep",
               "the flaky node leaves; the rest restart warm from the last checkpoint"),
    RepairInfo("collective_hang", _WARM, _STOPS_ALL, "replace",
               "a hang holds every replica in its collective; the stuck process is replaced"),
    RepairInfo("loss_spike", _WARM, _STOPS_ALL, "keep",
               "the bad batch reached every replica's weights through the all-reduce"),
    RepairInfo("nan_loss", _WARM, _STOPS_ALL, "keep",
               "the bad batch reached every replica's weights through the all-reduce"),
    RepairInfo("sdc", _WARM, _STOPS_ALL, "replace",
               "corrupt gradients spread to every replica through the all-reduce; the faulty "
               "device's memory is suspect"),
)
# fmt: on

REPAIR_BY_FAULT: dict[str, RepairInfo] = {r.fault: r for r in REPAIRS}

# The incident classes that correctly explain each fault kind of the drills' scenarios.
KIND_FAULTS: dict[str, frozenset[str]] = {
    "ecc_dbe": frozenset({"gpu_hardware"}),
    "xid": frozenset({"gpu_hardware"}),
    "thermal": frozenset({"thermal", "thermal_degraded"}),
    "corrupt_batch": frozenset({"loss_spike", "nan_loss"}),
    "sdc": frozenset({"sdc"}),
    "straggler": frozenset({"straggler"}),
    "hang": frozenset({"collective_hang"}),
    "crash": frozenset({"rank_crash", "rank_crash_repeat"}),
    # burn-in keeps a degraded link out of the job; one that degrades in a run slows its node
    "link_degraded": frozenset({"straggler"}),
    # burn-in keeps a drifted node out; no incident explains it during a run
    "config_drift": frozenset(),
}


def repair(fault: str) -> RepairInfo:
    """The repair of an incident's fault class; a class the table does not know stops every
    rank and keeps their processes (the cautious path that loses nothing)."""
    known = REPAIR_BY_FAULT.get(fault)
    if known is not None:
        return known
    return RepairInfo(fault, _WARM, _STOPS_ALL, "keep", "not in the repair table")


def allowed_for_kind(kind: str) -> tuple[frozenset[Recovery], str]:
    """The paths every incident class explaining a scenario fault kind allows, and why the
    others are not (an empty reason when all are). A kind no incident explains (a link fault,
    found before launch) allows every path."""
    allowed, why = set(_ANY), ""
    for fault in sorted(KIND_FAULTS.get(kind, frozenset())):
        info = repair(fault)
        allowed &= info.allowed
        if info.allowed != _ANY and not why:
            why = info.why
    return frozenset(allowed), why


def path_for_kind(kind: str) -> Recovery:
    """The path a scenario fault kind takes: the least live of its incident classes' paths (a
    kind no incident explains, like a link fault burn-in keeps out: live)."""
    order = list(Recovery)
    paths = [repair(f).path for f in KIND_FAULTS.get(kind, frozenset())]
    return max(paths, key=order.index) if paths else Recovery.LIVE


def markdown_repairs() -> str:
    """The repair table as Markdown, one row a fault class."""
    head = "| Fault | Path | Allowed | Struck process | Why |\n|---|---|---|---|---|"
    rows = (
        f"| `{r.fault}` | {r.path.value} | {', '.join(p.value for p in Recovery if p in r.allowed)}"
        f" | {r.process} | {r.why} |"
        for r in REPAIRS
    )
    return "\n".join((head, *rows)) + "\n"


if __name__ == "__main__":  # the table in docs/recovery.md
    print(markdown_repairs(), end="")
