"""Which repair path each fault class takes: today's restart, the warm restart, or live.

- `restart`: every rank process is stopped and started again (today's path).
- `warm_restart`: the surviving rank processes stay alive, leave the old process groups, join
  the new ones and load state in process; only a rank whose process cannot be trusted is
  started again.
- `live`: the data-parallel replica holding the fault leaves, the other replicas keep stepping,
  and a warm spare joins with state copied from a healthy peer.

`KIND_PATH` is the fault catalog's repair table (`sentinel/faults/repairs.py`) read for the
drill's fault kinds. A goodput class takes the least live path of the demo kinds it measures
(`DEMO_KIND_CLASS`).
"""

from __future__ import annotations

from enum import StrEnum

from sentinel.faults.repairs import path_for_kind
from sentinel.lab.goodput.model import DEMO_KIND_CLASS, RepairPath
from sentinel.lab.goodput.trace import FaultClass


class Recovery(StrEnum):
    """The path every fault takes in a projection (a scenario's top-level `recovery:`), or
    `catalog`: each fault the path the catalog gives it."""

    CATALOG = "catalog"
    RESTART = "restart"
    WARM_RESTART = "warm_restart"


# The fault catalog's path for each drill fault kind (`sentinel.faults.repairs`): a fault
# confined to one data-parallel replica (a node or GPU fault inside it) takes the live path; one
# that touches every replica (SDC's rollback, a hang that may span replicas, a crash whose cause
# may be in every rank) the warm restart.
KIND_PATH: dict[str, RepairPath] = {
    kind: RepairPath(path_for_kind(kind).value)
    for kind in ("ecc_dbe", "xid", "thermal", "link_degraded", "crash", "hang", "sdc")
}
# Mirrors the catalog's faults whose warm restart starts a new process for the faulty rank on the
# same node (its process is dead or stuck); the others swap the node for a warm spare, whose
# process is already started.
KIND_NEW_PROCESS = frozenset({"crash", "hang"})

_ORDER = (RepairPath.LIVE, RepairPath.WARM_RESTART, RepairPath.RESTART)


def _kinds(cls: FaultClass) -> list[str]:
    return [k for k, c in DEMO_KIND_CLASS.items() if c == cls and k in KIND_PATH]


def catalog_path(cls: FaultClass) -> RepairPath:
    """The least live path among the class's kinds (a class the catalog has no kind of: restart)."""
    paths = [KIND_PATH[k] for k in _kinds(cls)]
    return max(paths, key=_ORDER.index) if paths else RepairPath.RESTART


def new_process(cls: FaultClass) -> bool:
    """Whether a warm restart for this class starts a new rank process on the same node."""
    return any(k in KIND_NEW_PROCESS for k in _kinds(cls))


def paths_for(recovery: Recovery) -> dict[FaultClass, RepairPath]:
    if recovery == Recovery.CATALOG:
        return {c: catalog_path(c) for c in FaultClass}
    return dict.fromkeys(FaultClass, RepairPath(recovery.value))
