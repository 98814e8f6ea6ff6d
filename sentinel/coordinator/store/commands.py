"""Commands for nodes and jobs: the outbox their long-polls read, settled by an acknowledgement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sentinel.coordinator.core.rows import (
    CommandRow,
    NewCommand,
)
from sentinel.coordinator.store.base import COMMAND_COLS, SqlBase, dumps, from_row


class CommandsRepo(SqlBase):
    def insert_commands(self, commands: Sequence[NewCommand]) -> None:
        self._runmany(
            "INSERT INTO commands (id, target_kind, target, kind, args, created_at,"
            " incident_id) VALUES (?,?,?,?,?,?,?) ON CONFLICT (id) DO NOTHING",
            [
                (
                    c.id,
                    c.target_kind,
                    c.target,
                    c.kind,
                    dumps(c.args),
                    c.created_at,
                    c.incident_id,
                )
                for c in commands
            ],
        )

    def command(self, command_id: str) -> CommandRow | None:
        return self._row(
            CommandRow, f"SELECT {COMMAND_COLS} FROM commands WHERE id=?", (command_id,)
        )

    def take_commands(self, target_kind: str, target: str, now: float) -> list[CommandRow]:
        rows = self._all(
            f"SELECT {COMMAND_COLS} FROM commands WHERE target_kind=? AND target=?"
            " AND acked_at IS NULL ORDER BY created_at, id",
            (target_kind, target),
        )
        if rows:
            with self.tx():
                self._run(
                    "UPDATE commands SET delivered_at=? WHERE target_kind=? AND target=?"
                    " AND delivered_at IS NULL",
                    (now, target_kind, target),
                )
        return [from_row(CommandRow, r) for r in rows]

    def ack_command(self, command_id: str, result: dict[str, Any], now: float) -> bool:
        cur = self._run(
            "UPDATE commands SET acked_at=?, result=? WHERE id=? AND acked_at IS NULL",
            (now, dumps(result), command_id),
        )
        return cur.rowcount == 1

    def has_undelivered_commands(self) -> bool:
        return self._first("SELECT 1 FROM commands WHERE delivered_at IS NULL LIMIT 1") is not None
