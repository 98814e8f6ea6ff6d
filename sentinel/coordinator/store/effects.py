"""Outside effects (drain, notify, restore): recorded as intent, settled with the outcome."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select, update

from sentinel.coordinator.core.rows import EffectRow
from sentinel.coordinator.store.base import SqlBase, columns, dumps
from sentinel.coordinator.store.schema import effects

_EFFECT = [effects.c[n] for n in columns(EffectRow)]


class EffectsRepo(SqlBase):
    def insert_effect(
        self,
        key: str,
        kind: str,
        target: str,
        args: dict[str, Any],
        state: str,
        incident_id: int | None,
        now: float,
    ) -> EffectRow:
        intent = self._insert(effects).values(
            key=key,
            kind=kind,
            target=target,
            args=dumps(args),
            state=str(state),
            incident_id=incident_id,
            created_at=now,
        )
        self._x(intent.on_conflict_do_nothing(index_elements=["key"]))
        row = self.effect(key)
        assert row is not None
        return row

    def effect(self, key: str) -> EffectRow | None:
        return self._row(EffectRow, select(*_EFFECT).where(effects.c.key == key))

    def effects(self, states: Iterable[str]) -> list[EffectRow]:
        found = select(*_EFFECT).where(effects.c.state.in_([str(s) for s in states]))
        return self._rows(EffectRow, found.order_by(effects.c.id))

    def begin_effect(self, key: str) -> int:
        with self.tx():
            before = self._count(select(effects.c.attempts).where(effects.c.key == key))
            self._x(
                update(effects).where(effects.c.key == key).values(attempts=effects.c.attempts + 1)
            )
        return before

    def save_effect_result(self, key: str, result: dict[str, Any], now: float) -> None:
        outcome = dict(result=dumps(result), done_at=now)
        self._x(update(effects).where(effects.c.key == key).values(outcome))
