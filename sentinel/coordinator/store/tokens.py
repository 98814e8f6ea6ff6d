"""Access tokens: stored hashed, revoked in place."""

from __future__ import annotations

from sentinel.coordinator.core.rows import (
    TokenRow,
)
from sentinel.coordinator.store.base import TOKEN_COLS, SqlBase


class TokensRepo(SqlBase):
    def insert_token(
        self, token_id: str, hashed: str, role: str, node: str | None, job: str | None, now: float
    ) -> bool:
        with self.tx():
            cur = self._run(
                "INSERT INTO tokens (id, hash, role, node, job, created_at)"
                " VALUES (?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
                (token_id, hashed, str(role), node, job, now),
            )
        return cur.rowcount == 1

    def token(self, token_id: str) -> TokenRow | None:
        return self._row(
            TokenRow,
            f"SELECT {TOKEN_COLS} FROM tokens WHERE id=? AND revoked_at IS NULL",
            (token_id,),
        )

    def tokens(self) -> list[TokenRow]:
        return self._rows(TokenRow, f"SELECT {TOKEN_COLS} FROM tokens ORDER BY created_at")

    def revoke_token(self, token_id: str, now: float) -> bool:
        with self.tx():
            cur = self._run(
                "UPDATE tokens SET revoked_at=? WHERE id=? AND revoked_at IS NULL", (now, token_id)
            )
        return cur.rowcount > 0

    def count_tokens(self, revoked: bool) -> int:
        return self._count(
            "SELECT COUNT(*) FROM tokens WHERE revoked_at IS " + ("NOT NULL" if revoked else "NULL")
        )
