"""Incidents: one per fault, however many events report it, with an explicit state machine.

Correlation key: (fault class, scope). The scope comes from the playbook that classified the
event: `node` for hardware-like faults (eight GPUs of one node failing is one incident), `job`
for faults of the training run (every rank reporting the same loss spike is one incident).
Job-scoped keys include the job's generation: after a restart, a new spike is a new incident.
A symptom reported from a node that already has an active node-scoped incident (a rank that
died because its GPU fell off the bus) is linked to that incident instead of opening another.
"""

from __future__ import annotations

from dataclasses import dataclass

from sentinel.coordinator.lifecycle import (
    ACTIVE_INCIDENT,
    INCIDENT,
    IncidentState,
    TransitionError,
    check_transition,
)
from sentinel.protocol import Event

__all__ = [
    "ACTIVE_STATES",
    "TRANSITIONS",
    "Classification",
    "IncidentState",
    "TransitionError",
    "check_transition",
    "incident_key",
]


# The state table lives with every other one in lifecycle.py; these names stay importable.
TRANSITIONS = INCIDENT
ACTIVE_STATES = ACTIVE_INCIDENT


@dataclass(frozen=True)
class Classification:
    """What an event means: fault class, correlation scope and the incident's target."""

    fault: str
    scope: str  # "node" or "job"
    playbook: str


def incident_key(cls: Classification, event: Event, generation: int) -> tuple[str, str] | None:
    """(key, target) for an event, or None when the event lacks what its scope needs."""
    if cls.scope == "node":
        if event.source.node is None:
            return None
        return f"{cls.fault}|node:{event.source.node}", event.source.node
    if event.source.job is None:
        return None
    return f"{cls.fault}|job:{event.source.job}#g{generation}", f"job:{event.source.job}"
