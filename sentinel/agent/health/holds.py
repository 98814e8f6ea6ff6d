"""Raise, clear and hold: the one state machine every health rule goes through.

A rule's finding raises the sweep its condition holds. It then stays up for at least the rule's
`hold_s` after the condition last held, and after that only drops once the rule's clear
condition holds (a lower threshold for levels: hysteresis). A signal flapping faster than the
hold therefore keeps one finding up for the whole storm: one verdict change, one incident, and
no evict/return loop. The holds and clear conditions are the catalog's (sentinel.faults).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sentinel.faults.catalog import RuleInfo
from sentinel.protocol import Finding


@dataclass(slots=True)
class _Raised:
    since: float
    last_raised: float
    finding: Finding


class Holds:
    def __init__(self, hold_overrides: dict[str, float] | None = None) -> None:
        self._raised: dict[tuple[Hashable, str], _Raised] = {}
        self.overrides = dict(hold_overrides or {})

    def hold_s(self, info: RuleInfo) -> float:
        return self.overrides.get(info.name, info.hold_s)

    def step(
        self,
        scope: Hashable,
        info: RuleInfo,
        raised: Finding | None,
        clear: Callable[[], bool],
        now: float,
    ) -> Finding | None:
        """The rule's finding after this sweep: `raised` if its condition holds now, the held
        one while the hold lasts or the clear condition does not hold, else None. `clear` is
        only asked for a finding past its hold (most rules are quiet most of the time)."""
        key = (scope, info.name)
        state = self._raised.get(key)
        if raised is not None:
            if state is None:
                self._raised[key] = _Raised(now, now, raised)
            else:
                state.last_raised, state.finding = now, raised
            return raised
        if state is None:
            return None
        if now - state.last_raised < self.hold_s(info) or not clear():
            return state.finding
        del self._raised[key]
        return None

    def holding(self, scope: Hashable, name: str) -> bool:
        return (scope, name) in self._raised
