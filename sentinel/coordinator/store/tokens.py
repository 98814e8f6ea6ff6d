"""Access tokens: stored hashed, revoked in place."""

from __future__ import annotations

from sqlalchemy import func, select, update

from sentinel.coordinator.core.rows import TokenRow
from sentinel.coordinator.store.base import SqlBase, columns
from sentinel.coordinator.store.schema import tokens

_TOKEN = [tokens.c[n] for n in columns(TokenRow)]


class TokensRepo(SqlBase):
    def insert_token(
        self, token_id: str, hashed: str, role: str, node: str | None, job: str | None, now: float
    ) -> bool:
        new = self._insert(tokens).values(
            id=token_id, hash=hashed, role=str(role), node=node, job=job, created_at=now
        )
        with self.tx():
            return bool(self._x(new.on_conflict_do_nothing(index_elements=["id"])) == 1)

    def token(self, token_id: str) -> TokenRow | None:
        live = (tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
        return self._row(TokenRow, select(*_TOKEN).where(*live))

    def tokens(self) -> list[TokenRow]:
        return self._rows(TokenRow, select(*_TOKEN).order_by(tokens.c.created_at))

    def revoke_token(self, token_id: str, now: float) -> bool:
        live = (tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
        with self.tx():
            return bool(self._x(update(tokens).where(*live).values(revoked_at=now)) > 0)

    def count_tokens(self, revoked: bool) -> int:
        gone = tokens.c.revoked_at.is_not(None) if revoked else tokens.c.revoked_at.is_(None)
        return self._count(select(func.count()).select_from(tokens).where(gone))
