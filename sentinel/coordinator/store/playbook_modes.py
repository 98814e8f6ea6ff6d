"""Playbook modes: the operator's shadow/acting switch, one row a playbook switched."""

from __future__ import annotations

from sqlalchemy import select

from sentinel.coordinator.store.base import SqlBase
from sentinel.coordinator.store.schema import playbook_modes


class PlaybookModesRepo(SqlBase):
    def playbook_mode(self, playbook: str) -> str | None:
        """The mode an operator set for `playbook`, or None where none did."""
        query = select(playbook_modes.c.mode).where(playbook_modes.c.playbook == playbook)
        mode = self._scalar(query)
        return None if mode is None else str(mode)

    def playbook_modes(self) -> dict[str, str]:
        query = select(playbook_modes.c.playbook, playbook_modes.c.mode)
        return {playbook: mode for playbook, mode in self._x(query)}

    def set_playbook_mode(self, playbook: str, mode: str, who: str, now: float) -> None:
        row = {"playbook": playbook, "mode": mode, "set_by": who, "set_at": now}
        upsert = self._insert(playbook_modes).values(**row)
        done = {"mode": mode, "set_by": who, "set_at": now}
        self._x(upsert.on_conflict_do_update(index_elements=["playbook"], set_=done))
