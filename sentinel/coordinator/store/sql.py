"""The store: every repository on one connection, the state writers, and the audit.

`SqlStore` gathers the repositories per aggregate (`events.py`, `fleet.py`, `incidents.py`,
`effects.py`, `commands.py`, `tokens.py`, `reports.py`); a backend (`sqlite.py`, `postgres.py`)
is a subclass that brings the connection. `set_state` writes only if the row still holds
`expected` (compare-and-set), so a writer that read a stale state loses instead of
overwriting: what several coordinators sharing one database need. The methods named in
`core.store.STATE_WRITERS` write a state column; only `core/lifecycle.py` calls them.
"""

from __future__ import annotations

import logging
from typing import Any

from sentinel.coordinator.core.states import Entity
from sentinel.coordinator.store.base import KEYS, STATE_COLUMNS, dumps, key_ok
from sentinel.coordinator.store.commands import CommandsRepo
from sentinel.coordinator.store.effects import EffectsRepo
from sentinel.coordinator.store.events import EventsRepo
from sentinel.coordinator.store.fleet import FleetRepo
from sentinel.coordinator.store.incidents import IncidentsRepo
from sentinel.coordinator.store.reports import ReportsRepo
from sentinel.coordinator.store.tokens import TokensRepo

audit_log = logging.getLogger("sentinel.coordinator.audit")


class SqlStore(
    ReportsRepo, EventsRepo, FleetRepo, IncidentsRepo, EffectsRepo, CommandsRepo, TokensRepo
):
    """The coordinator's durable state, on any backend."""

    def state_of(self, entity: Entity, key: str | int) -> str | None:
        table, col, _ = STATE_COLUMNS[entity]
        if not key_ok(key):
            return None
        row = self._first(f"SELECT {col} FROM {table} WHERE {KEYS[entity]}=?", (key,))
        return None if row is None else str(row[0])

    def set_state(
        self,
        entity: Entity,
        key: str | int,
        state: str,
        now: float,
        expected: str,
        reason: str | None = None,
    ) -> bool:
        table, col, stamp = STATE_COLUMNS[entity]
        sets, params = [f"{col}=?"], [str(state)]
        if stamp:
            sets.append(f"{stamp}=?")
            params.append(now)  # type: ignore[arg-type]
        if reason is not None and entity is Entity.NODE:
            sets.append("reason=?")
            params.append(reason)
        cur = self._run(
            f"UPDATE {table} SET {', '.join(sets)} WHERE {KEYS[entity]}=? AND {col}=?",
            (*params, key, str(expected)),
        )
        return cur.rowcount == 1

    def audit(
        self,
        now: float,
        who: str,
        what: str,
        why: str,
        incident_id: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self._run(
            "INSERT INTO audit (ts, who, what, why, incident_id, detail) VALUES (?,?,?,?,?,?)",
            (now, who, what, why, incident_id, dumps(detail or {})),
        )
        # Every audited act (an incident opened, a playbook step and its outcome, an eviction, a
        # spare swap, a refusal, an operator's action) is also one log line, for whoever tails
        # the coordinator's journal.
        audit_log.info(
            "%s: %s", what, why, extra={"incident": incident_id, "by": who, "detail": detail or {}}
        )
