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
from enum import StrEnum

from sentinel.protocol import Event


class IncidentState(StrEnum):
    OPEN = "open"
    ACTING = "acting"
    MITIGATED = "mitigated"
    RESOLVED = "resolved"
    FAILED = "failed"
    ESCALATED = "escalated"


S = IncidentState
TRANSITIONS: dict[IncidentState, frozenset[IncidentState]] = {
    S.OPEN: frozenset({S.ACTING, S.ESCALATED, S.RESOLVED, S.FAILED}),
    S.ACTING: frozenset({S.MITIGATED, S.FAILED, S.ESCALATED, S.RESOLVED}),
    S.MITIGATED: frozenset({S.RESOLVED, S.ESCALATED, S.OPEN}),  # OPEN: recurred after cooldown
    S.ESCALATED: frozenset({S.ACTING, S.RESOLVED, S.FAILED}),
    S.FAILED: frozenset({S.ESCALATED, S.RESOLVED}),
    S.RESOLVED: frozenset(),
}
# States in which a new report of the same fault joins the incident instead of opening one.
ACTIVE_STATES = frozenset({S.OPEN, S.ACTING, S.MITIGATED, S.ESCALATED})


class TransitionError(ValueError):
    pass


def check_transition(current: IncidentState, new: IncidentState) -> None:
    if new not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none (terminal)"
        raise TransitionError(f"incident cannot move {current} -> {new}; allowed: {allowed}")


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


def symptom_key(event: Event, node_faults: frozenset[str]) -> list[str]:
    """Keys of node-scoped incidents an event from that node would be a symptom of."""
    if event.source.node is None or event.source.rank is None:
        return []
    return [f"{fault}|node:{event.source.node}" for fault in sorted(node_faults)]
