"""The store: every repository on one connection, the state writers, and the audit.

`SqlStore` gathers the repositories per aggregate (`events.py`, `fleet.py`, `incidents.py`,
`effects.py`, `commands.py`, `tokens.py`, and `reports.py` for what operators and `/metrics`
read); a backend (`sqlite.py`, `postgres.py`) is a subclass that brings the connection.
`set_state` writes only if the row still holds `expected` (compare-and-set), so a writer that
read a stale state loses instead of overwriting: what several coordinators sharing one database
need. The methods named in `core.store.STATE_WRITERS` write a state column; only
`core/lifecycle.py` calls them.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select, update

from sentinel.coordinator.core.states import Entity
from sentinel.coordinator.store.base import dumps, key_ok
from sentinel.coordinator.store.bundles import BundlesRepo
from sentinel.coordinator.store.commands import CommandsRepo
from sentinel.coordinator.store.effects import EffectsRepo
from sentinel.coordinator.store.events import EventsRepo
from sentinel.coordinator.store.fleet import FleetRepo
from sentinel.coordinator.store.playbook_modes import PlaybookModesRepo
from sentinel.coordinator.store.reports import ReportsRepo
from sentinel.coordinator.store.schema import STATE_COLUMNS, audit
from sentinel.coordinator.store.tokens import TokensRepo

audit_log = logging.getLogger("sentinel.coordinator.audit")


class SqlStore(
    ReportsRepo,
    EventsRepo,
    FleetRepo,
    EffectsRepo,
    CommandsRepo,
    TokensRepo,
    PlaybookModesRepo,
    BundlesRepo,
):
    """The coordinator's durable state, on any backend."""

    def state_of(self, entity: Entity, key: str | int) -> str | None:
        where = STATE_COLUMNS[entity]
        if not key_ok(key):
            return None
        state = self._scalar(select(where.state).where(where.key == key))
        return None if state is None else str(state)

    def set_state(
        self,
        entity: Entity,
        key: str | int,
        state: str,
        now: float,
        expected: str,
        reason: str | None = None,
    ) -> bool:
        where = STATE_COLUMNS[entity]
        moved: dict[Any, Any] = {where.state: str(state)}
        if where.stamp is not None:
            moved[where.stamp] = now
        if reason is not None and entity is Entity.NODE:
            moved[where.state.table.c.reason] = reason
        table = where.state.table
        cas = update(table).where(where.key == key, where.state == str(expected)).values(moved)
        return bool(self._x(cas) == 1)

    def audit(
        self,
        now: float,
        who: str,
        what: str,
        why: str,
        incident_id: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        entry = dict(
            ts=now, who=who, what=what, why=why, incident_id=incident_id, detail=dumps(detail or {})
        )
        self._x(audit.insert().values(entry))
        # Every audited act (an incident opened, a playbook step and its outcome, an eviction, a
        # spare swap, a refusal, an operator's action) is also one log line, for whoever tails
        # the coordinator's journal.
        audit_log.info(
            "%s: %s", what, why, extra={"incident": incident_id, "by": who, "detail": detail or {}}
        )
