"""Outside effects (drain, notify, restore): recorded as intent, settled with the outcome."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sentinel.coordinator.core.rows import (
    EffectRow,
)
from sentinel.coordinator.store.base import EFFECT_COLS, SqlBase, dumps, from_row


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
        self._run(
            "INSERT INTO effects (key, kind, target, args, state, incident_id, created_at)"
            " VALUES (?,?,?,?,?,?,?) ON CONFLICT(key) DO NOTHING",
            (key, kind, target, dumps(args), str(state), incident_id, now),
        )
        row = self.effect(key)
        assert row is not None
        return row

    def effect(self, key: str) -> EffectRow | None:
        return self._row(EffectRow, f"SELECT {EFFECT_COLS} FROM effects WHERE key=?", (key,))

    def effects(self, states: Iterable[str]) -> list[EffectRow]:
        states = [str(s) for s in states]
        return [
            from_row(EffectRow, r)
            for r in self._all(
                f"SELECT {EFFECT_COLS} FROM effects"
                f" WHERE state IN ({','.join('?' * len(states))}) ORDER BY id",
                states,
            )
        ]

    def begin_effect(self, key: str) -> int:
        with self.tx():
            before = self._count("SELECT attempts FROM effects WHERE key=?", (key,))
            self._run("UPDATE effects SET attempts=attempts+1 WHERE key=?", (key,))
        return before

    def save_effect_result(self, key: str, result: dict[str, Any], now: float) -> None:
        self._run("UPDATE effects SET result=?, done_at=? WHERE key=?", (dumps(result), now, key))
