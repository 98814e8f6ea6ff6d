"""Outside effects: recorded as intent, made outside any transaction, settled, reconciled.

A step that needs the outside world (drain a node through the eviction backend, notify a
person) records an `effects` row in its own transaction and waits. Then, in three moves:

1. `begin` counts the attempt (a store write, before the call);
2. `perform` makes the call: no store access at all, so the coordinator runs it on a thread
   of its own with a timeout while the store thread goes on acknowledging events;
3. `settle` records the outcome and moves what it decided (the node: draining -> evicted, or
   back to active when the scheduler refused; an operator's return: validating -> returned,
   or back to evicted). Holding a node for its validation, and releasing it, moves nothing:
   the return's step reads their outcome.

A coordinator killed between 1 and 3 leaves the effect `intended` with attempts above zero.
The next `perform` of it asks the backend first (`is_evicted`): a drain the scheduler already
holds is recorded as done, not made again. Job commands need none of this: the `commands`
table is their outbox, delivered by long-poll and settled by the target's acknowledgement.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from sentinel.coordinator.core import lifecycle
from sentinel.coordinator.core.rows import EffectRow
from sentinel.coordinator.core.states import EffectState, Entity, NodeState
from sentinel.coordinator.core.store import StateStore

log = logging.getLogger("sentinel.coordinator.effects")


class EvictionError(RuntimeError):
    """The scheduler could not be told (its command failed, timed out, or is missing)."""


@dataclass(frozen=True, slots=True)
class SchedulerNode:
    """A node as the scheduler sees it: its own word for the state, its reason, and whether
    that holds the node out of service (drained, down)."""

    state: str
    reason: str
    out: bool


class EvictionBackend(ABC):
    """Takes a node out of service where the scheduler looks (exclude file, Slurm, Kubernetes)."""

    name: ClassVar[str]
    polls_scheduler: ClassVar[bool] = False  # whether `scheduler_nodes` can tell

    @abstractmethod
    def evict(self, node: str, reason: str) -> str:
        """Idempotent; returns a short description of what was done."""

    def restore(self, node: str, reason: str) -> str:
        """Put an evicted node back in service (an operator's decision); idempotent."""
        raise EvictionError(f"the {self.name} backend cannot return nodes; do it by hand")

    def hold_for_validation(self, node: str) -> tuple[str, dict[str, str]]:
        """Let an evicted node run its validation burn-in and nothing else, where the scheduler
        would run nothing there (Slurm runs no job on a drained node); idempotent. What was
        done, and what the node's agent needs to launch the burn-in there. By default the
        burn-in runs beside the scheduler, and nothing needs doing."""
        return f"{node} needs no hold for its validation ({self.name})", {}

    def release_validation(self, node: str, reason: str) -> str:
        """Undo `hold_for_validation` for a node that stays out: out of service again."""
        return f"{node} was not held ({self.name})"

    def scheduler_nodes(self) -> dict[str, SchedulerNode]:
        """Every node the scheduler knows, as it sees it (the scheduler bridge's poll,
        `core/scheduler.py`), where `polls_scheduler` says the backend can tell. Raises
        EvictionError when the scheduler cannot be read: never an empty answer."""
        raise EvictionError(f"the {self.name} backend cannot tell the scheduler's node states")

    def is_evicted(self, node: str) -> bool:
        """Whether the scheduler holds `node` out of service now: what a coordinator that
        crashed during an eviction asks before asking again. False when it cannot tell."""
        return False


class EffectKind(StrEnum):
    EVICT = "evict"  # target: a node; args: {"reason", "adopt"}
    NOTIFY = "notify"  # target: the incident; args: {"message", "severity"}
    RESTORE = "restore"  # target: a node an operator returns; args: {"reason"}
    HOLD = "hold"  # target: a node to validate; result: {"did", "launch"}
    RELEASE = "release"  # target: a held node that stays out; args: {"reason"}


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


class Effects:
    def __init__(self, store: StateStore, backend: EvictionBackend) -> None:
        self.store = store
        self.backend = backend

    # --- store thread ----------------------------------------------------------------------

    def pending(self) -> list[EffectRow]:
        return self.store.effects([EffectState.INTENDED])

    def begin(self, effect: EffectRow) -> bool:
        """Count the attempt; True when one began before (the outcome of which is unknown)."""
        return self.store.begin_effect(effect.key) > 0

    def settle(self, effect: EffectRow, outcome: Outcome, now: float) -> None:
        state = EffectState.DONE if outcome.ok else EffectState.FAILED
        with self.store.tx():
            self.store.save_effect_result(effect.key, outcome.detail, now)
            who = f"effect:{effect.kind}"
            why = str(outcome.detail.get("did") or outcome.detail.get("error") or state)
            lifecycle.move(
                self.store,
                Entity.EFFECT,
                effect.key,
                state,
                now,
                who,
                why,
                incident_id=effect.incident_id,
                detail={"target": effect.target},
            )
            node_moves = {
                EffectKind.EVICT: (NodeState.EVICTED, NodeState.ACTIVE),
                EffectKind.RESTORE: (NodeState.RETURNED, NodeState.EVICTED),
            }
            if effect.kind in node_moves:
                ok, refused = node_moves[EffectKind(effect.kind)]
                node = ok if outcome.ok else refused
                lifecycle.move(
                    self.store,
                    Entity.NODE,
                    effect.target,
                    node,
                    now,
                    who,
                    why,
                    incident_id=effect.incident_id,
                )

    def run_inline(self, clock: Callable[[], float]) -> int:
        """Make every pending effect here and now (tests, tools); the number made."""
        pending = self.pending()
        for effect in pending:
            outcome = self.perform(effect, self.begin(effect))
            self.settle(effect, outcome, clock())
        return len(pending)

    # --- any thread: no store access ---------------------------------------------------------

    def perform(self, effect: EffectRow, reconcile: bool) -> Outcome:
        """Make the call; never raises (a failure is an outcome)."""
        try:
            return self._perform(effect, reconcile)
        except Exception as e:
            log.warning("effect %s failed: %s", effect.key, e)
            return Outcome(False, {"error": f"{type(e).__name__}: {e}"})

    def _perform(self, effect: EffectRow, reconcile: bool) -> Outcome:
        if effect.kind == EffectKind.EVICT:
            node = effect.target
            if reconcile and self.backend.is_evicted(node):
                did = f"{node} found out of service ({self.backend.name}); not asked again"
                return Outcome(True, {"did": did, "reconciled": True})
            if effect.args.get("adopt") and self.backend.is_evicted(node):
                did = f"{node} already out of service ({self.backend.name}): its reason kept"
                return Outcome(True, {"did": did, "adopted": True})
            return Outcome(True, {"did": self.backend.evict(node, str(effect.args["reason"]))})
        if effect.kind == EffectKind.RESTORE:  # an operator's return: asked every time
            return Outcome(
                True, {"did": self.backend.restore(effect.target, effect.args["reason"])}
            )
        if effect.kind == EffectKind.HOLD:  # idempotent: asked every time
            did, launch = self.backend.hold_for_validation(effect.target)
            return Outcome(True, {"did": did, "launch": launch})
        if effect.kind == EffectKind.RELEASE:
            reason = str(effect.args["reason"])
            return Outcome(True, {"did": self.backend.release_validation(effect.target, reason)})
        if effect.kind == EffectKind.NOTIFY:
            log.warning(
                "notify: %s",
                effect.args["message"],
                extra={"incident": effect.incident_id, "severity": effect.args["severity"]},
            )
            return Outcome(True, {"did": "logged"})
        return Outcome(False, {"error": f"unknown effect kind {effect.kind!r}"})
