"""How much an incident counts against a node, and when a node is a lemon.

A node keeps a history of the incidents whose repair took it out, each weighted by how sure the
blame is: hardware evidence that names the GPU (an XID, a double-bit ECC error, a thermal
reading, an SDC recompute, a measured straggler) counts 1.0; circumstantial blame ("it was in
the gang when the job hung", crashes that kept landing on it) counts 0.25. A node whose weights
over the window reach the threshold is a lemon: the ordinary repair does not cure it, so it
stays out of the spare pool until a person clears it (after a deep repair).

The coordinator (`actions/restore.py`) and the goodput simulator (`goodput/lemons.py`) score
with this one module, so the simulator's figures are the coordinator's policy.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

HIGH_CONFIDENCE = 1.0
LOW_CONFIDENCE = 0.25
DAY_S = 86400.0

# Incident classes (playbook `incident.fault`) whose blame rests on circumstance, not on a reading
# of the node's own hardware, or on someone else's word (a drain in the scheduler). Every other
# class that evicts a node names it by its own evidence.
CIRCUMSTANTIAL = frozenset({"collective_hang", "rank_crash_repeat", "scheduler_drain"})


def confidence(fault: str) -> float:
    """The weight of an incident of class `fault` against the node it took out."""
    return LOW_CONFIDENCE if fault in CIRCUMSTANTIAL else HIGH_CONFIDENCE


class LemonPolicy(BaseModel):
    """When a node is a lemon (config `coordinator.lemon`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    threshold: float = Field(default=2.5, gt=0)
    window_s: float = Field(default=60 * DAY_S, gt=0)


def lemon_score(history: Iterable[tuple[float, float]], now: float, policy: LemonPolicy) -> float:
    """The sum of the (time, weight) blames within the policy's window before `now`."""
    return sum(w for t, w in history if now - policy.window_s <= t <= now)
