"""Before a drill starts: can the scenario's faults be repaired at all with its fleet?

An evicting repair (a node taken out for a spare) needs a free spare, as does a node that
burn-in keeps out of the job. A scenario with fewer spares than that cannot pass: the demo
warns before it spends minutes training, and the drill's verdict then says why it failed.
"""

from __future__ import annotations

from collections.abc import Iterable

from sentinel.coordinator.core.playbooks import Playbook
from sentinel.scenario import PRELAUNCH_FAULTS, Scenario

# The incident class the first occurrence of each fault kind opens (result.EXPLAINS lists every
# class that may explain it; a repeat or a milder reading can open another).
FIRST_RESPONSE: dict[str, str] = {
    "ecc_dbe": "gpu_hardware",
    "xid": "gpu_hardware",
    "thermal": "thermal",
    "corrupt_batch": "loss_spike",
    "sdc": "sdc",
    "straggler": "straggler",
    "hang": "collective_hang",
    "crash": "rank_crash",
}


def evicting_classes(playbooks: Iterable[Playbook]) -> set[str]:
    """Incident classes whose playbook takes a node out of the job."""
    return {
        book.incident.fault
        for book in playbooks
        if any(step.action == "evict_node" for step in book.steps)
    }


def repair_warnings(scenario: Scenario, playbooks: Iterable[Playbook]) -> list[str]:
    """Why the scenario cannot be repaired with its spares (empty when it can)."""
    evicting = evicting_classes(playbooks)
    needs: list[str] = []
    for fault in scenario.faults:
        if isinstance(fault, PRELAUNCH_FAULTS):
            needs.append(f"{fault.kind} on {fault.node} (burn-in keeps it out)")
        elif FIRST_RESPONSE.get(fault.kind) in evicting:
            where = getattr(fault, "node", None) or f"rank-{getattr(fault, 'rank', '?')}"
            needs.append(f"{fault.kind} on {where} (its playbook evicts the node)")
    spares = scenario.fleet.spares
    if len(needs) <= spares:
        return []
    return [
        f"{len(needs)} {'faults need' if len(needs) > 1 else 'fault needs'} a spare node but "
        f"the fleet has {spares}: "
        + "; ".join(needs)
        + ". The repairs past the last spare will be refused and escalated, and the drill "
        "will fail."
    ]
