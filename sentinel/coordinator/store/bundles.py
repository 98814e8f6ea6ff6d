"""Evidence bundles (`core/bundle.py`): one archive an incident, inserted once and never
replaced, and the evidence steps still waiting for theirs."""

from __future__ import annotations

import dataclasses

from sqlalchemy import select

from sentinel.coordinator.core.rows import BundleRow, StepRow
from sentinel.coordinator.store.base import SqlBase, columns, dumps, key_ok
from sentinel.coordinator.store.incidents import STEP
from sentinel.coordinator.store.schema import actions, bundles, incidents

_BUNDLE = [bundles.c[n] for n in columns(BundleRow)]


class BundlesRepo(SqlBase):
    def insert_bundle(self, bundle: BundleRow) -> bool:
        """Keep an incident's bundle; False (and nothing written) when it has one already."""
        row = dataclasses.asdict(bundle) | {"manifest": dumps(bundle.manifest)}
        added = self._insert(bundles).values(**row)
        return bool(self._x(added.on_conflict_do_nothing(index_elements=["incident_id"])) == 1)

    def bundle(self, incident_id: int) -> BundleRow | None:
        if not key_ok(incident_id):
            return None
        row = self._row(BundleRow, select(*_BUNDLE).where(bundles.c.incident_id == incident_id))
        if row is None:
            return None
        return dataclasses.replace(row, data=bytes(row.data))  # a driver's buffer, as bytes

    def unsealed_evidence(self, limit: int) -> list[StepRow]:
        """Live evidence steps done (or ended unfinished by their run's close: no `done_at`)
        whose incident has no bundle yet, oldest first."""
        sealed = select(bundles.c.incident_id)
        found = select(*STEP).where(
            actions.c.action == "evidence",
            actions.c.state == "done",
            actions.c.dry_run == 0,
            actions.c.incident_id.not_in(sealed),
        )
        return self._rows(StepRow, found.order_by(actions.c.id).limit(limit))

    def bundle_seconds(self) -> list[tuple[str, float]]:
        """(playbook, seconds from the evidence step's start to the bundle sealed) of every
        bundle: `/metrics`' `bundle` stage."""
        took = bundles.c.sealed_at - bundles.c.started_at
        found = select(incidents.c.playbook, took).join(
            incidents, incidents.c.id == bundles.c.incident_id
        )
        return [(str(book), float(s)) for book, s in self._x(found) if book is not None]
