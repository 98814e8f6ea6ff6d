"""Bearer tokens with roles, stored hashed (sha256), compared in constant time.

Roles: `node` reports only as its own node and fetches only its own commands; `job` the same
for its job; `operator` reads everything and runs operator actions; `admin` may do anything.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sentinel.coordinator.core.rows import TokenRow
from sentinel.coordinator.core.store import StateStore
from sentinel.protocol import COORDINATOR_EVENTS, Event

ADMIN_TOKEN_FILE = "admin.token"

ID_DRAWS = 8


class Role(StrEnum):
    NODE = "node"
    JOB = "job"
    OPERATOR = "operator"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    id: str
    role: Role
    node: str | None = None
    job: str | None = None

    def __str__(self) -> str:
        scope = self.node or self.job
        return f"{self.role}:{self.id}" + (f"({scope})" if scope else "")

    def may_report(self, event: Event) -> str | None:
        """None when allowed, else why not (the 403 message)."""
        if self.role == Role.ADMIN:
            return None
        if event.kind in COORDINATOR_EVENTS:
            return f"event {event.id}: {event.kind} is the coordinator's own observation"
        if self.role == Role.NODE:
            mine, said, scope = self.node, event.source.node, "as node"
        elif self.role == Role.JOB:
            mine, said, scope = self.job, event.source.job, "for job"
        else:
            return f"role {self.role} cannot report events"
        if said == mine:
            return None
        return f"event {event.id}: a {self.role} token for {mine!r} cannot report {scope} {said!r}"

    def may_report_all(self, events: list[Event]) -> str | None:
        """None when every event is allowed, else why the first one that is not is refused."""
        if self.role == Role.ADMIN:
            return None
        if self.role == Role.NODE:
            node = self.node
            bad = next(
                (e for e in events if e.source.node != node or e.kind in COORDINATOR_EVENTS), None
            )
        elif self.role == Role.JOB:
            job = self.job
            bad = next(
                (e for e in events if e.source.job != job or e.kind in COORDINATOR_EVENTS), None
            )
        else:
            bad = events[0] if events else None
        return None if bad is None else self.may_report(bad)

    def may_target(self, kind: str, target: str) -> bool:
        if self.role in (Role.OPERATOR, Role.ADMIN):
            return True
        return (kind, target) in (("node", self.node), ("job", self.job))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """Tokens in the store, every live one also held in memory (by id, with its hash), so a
    request is authenticated on the event loop with one hash and no trip to the store: a fleet
    reconnecting at once would otherwise queue a query per node on the store thread, in front
    of its batches' commits. A token made elsewhere (`sentinel token create`, another replica)
    is read from the store the first time it is shown. One revoked through this object stops at
    once; one revoked elsewhere stops at the next `reload_if_revoked`, which the coordinator
    calls on every engine tick."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._known: dict[str, tuple[str, Principal]] = {}  # id -> (hash, principal)
        self._revoked = -1  # revocations seen by the last load: none loaded yet

    def cached(self, header: str | None) -> Principal | None:
        """The principal of a token held in memory, checked against its hash; None when the
        token is not held (ask `authenticate`) or does not match."""
        parsed = _parse(header)
        known = self._known.get(parsed[0]) if parsed else None
        if parsed is None or known is None:
            return None
        hashed, principal = known
        return principal if hmac.compare_digest(hashed, hash_token(parsed[1])) else None

    def reload_if_revoked(self) -> None:
        """Load every live token once the store holds a revocation not seen yet (revocations
        only ever add up; a small table, so counting them is cheap), and at the first call."""
        revoked = self.store.count_tokens(revoked=True)
        if revoked != self._revoked:
            self._revoked = revoked
            live = (t for t in self.store.tokens() if t.revoked_at is None)
            self._known = {t.id: _held(t) for t in live}

    def create(
        self, role: Role, node: str | None = None, job: str | None = None, now: float = 0.0
    ) -> tuple[str, str]:
        """(token id, secret). The secret is shown once; only its hash is kept."""
        if role == Role.NODE and not node:
            raise ValueError("a node token needs --node NAME")
        if role == Role.JOB and not job:
            raise ValueError("a job token needs --job ID")
        if role not in (Role.NODE, Role.JOB) and (node or job):
            raise ValueError(f"a {role} token is not scoped to a node or job")
        # Ids are 32 bits: among a large fleet's tokens two draws can meet (~0.2% at 4,096
        # tokens), so a taken id is drawn again rather than failing the create.
        for _ in range(ID_DRAWS):
            token_id = secrets.token_hex(4)
            secret = f"snt_{token_id}_{secrets.token_urlsafe(32)}"
            if self.store.insert_token(token_id, hash_token(secret), role, node, job, now):
                return token_id, secret
        raise RuntimeError(f"no free token id in {ID_DRAWS} draws")

    def revoke(self, token_id: str, now: float = 0.0) -> bool:
        revoked = self.store.revoke_token(token_id, now)
        self._known.pop(token_id, None)
        return revoked

    def active_count(self) -> int:
        return self.store.count_tokens(revoked=False)

    def authenticate(self, header: str | None) -> Principal | None:
        """`cached`, reading a token not held from the store (and holding it from then on)."""
        parsed = _parse(header)
        if parsed is None:
            return None
        if parsed[0] not in self._known:
            row = self.store.token(parsed[0])
            if row is None:
                return None
            self._known[row.id] = _held(row)
        return self.cached(header)

    def ensure_admin(self, state_dir: Path, now: float) -> Path | None:
        """With no token at all, make an admin token readable by the owner only."""
        if self.active_count() > 0:
            return None
        _, secret = self.create(Role.ADMIN, now=now)
        path = state_dir / ADMIN_TOKEN_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        os.chmod(path, 0o600)
        return path


def _parse(header: str | None) -> tuple[str, str] | None:
    """(token id, secret) of a bearer header naming a Sentinel token, or None."""
    if not header or not header.startswith("Bearer "):
        return None
    secret = header[len("Bearer ") :].strip()
    parts = secret.split("_")
    if len(parts) < 3 or parts[0] != "snt":
        return None
    return parts[1], secret


def _held(row: TokenRow) -> tuple[str, Principal]:
    return row.hash, Principal(row.id, Role(row.role), row.node, row.job)
