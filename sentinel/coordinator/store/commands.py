"""Commands for nodes and jobs: the outbox their long-polls read, settled by an acknowledgement."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update

from sentinel.coordinator.core.rows import CommandRow, NewCommand
from sentinel.coordinator.store.base import SqlBase, columns, dumps
from sentinel.coordinator.store.schema import commands

_COMMAND = [commands.c[n] for n in columns(CommandRow)]


class CommandsRepo(SqlBase):
    def insert_commands(self, queued: Sequence[NewCommand]) -> None:
        rows = [{**dataclasses.asdict(c), "args": dumps(c.args)} for c in queued]
        if rows:
            self._x(self._insert(commands).on_conflict_do_nothing(index_elements=["id"]), rows)

    def command(self, command_id: str) -> CommandRow | None:
        return self._row(CommandRow, select(*_COMMAND).where(commands.c.id == command_id))

    def take_commands(self, target_kind: str, target: str, now: float) -> list[CommandRow]:
        mine = (commands.c.target_kind == target_kind, commands.c.target == target)
        found = select(*_COMMAND).where(*mine, commands.c.acked_at.is_(None))
        rows = self._rows(CommandRow, found.order_by(commands.c.created_at, commands.c.id))
        if rows:
            with self.tx():
                fresh = commands.c.delivered_at.is_(None)
                self._x(update(commands).where(*mine, fresh).values(delivered_at=now))
        return rows

    def ack_command(self, command_id: str, result: dict[str, Any], now: float) -> bool:
        open_ = (commands.c.id == command_id, commands.c.acked_at.is_(None))
        acked = update(commands).where(*open_).values(acked_at=now, result=dumps(result))
        return bool(self._x(acked) == 1)

    def has_undelivered_commands(self) -> bool:
        undelivered = select(commands.c.id).where(commands.c.delivered_at.is_(None)).limit(1)
        return self._scalar(undelivered) is not None
