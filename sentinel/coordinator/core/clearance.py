"""Measured before it may act: what the rules corpus's measurement allows a playbook.

A playbook with a step that takes a node out of service or stops the job acts only once the
rules corpus has measured its trigger's precision at the bar (`sentinel.precision.gate` reads
the scores and gives every playbook its `Clearance`; `Playbook.mode` obeys it).
"""

from __future__ import annotations

from dataclasses import dataclass

DESTRUCTIVE_ACTIONS = frozenset({"evict_node", "stop_job"})


@dataclass(frozen=True)
class Clearance:
    acts: bool
    why: str
