"""The one migration runner, for both databases: Alembic (`migrations/`) on the store's own
connection, inside one transaction.

An empty database gets the schema as `schema.py` declares it, stamped with the newest revision;
one Alembic has versioned is upgraded to it; one made before Alembic (its `schema_version`
table) is taken over by the first revision. On PostgreSQL the transaction first takes an
advisory lock, so replicas starting together migrate once. A database newer than this build is
refused, with what to do.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import func, inspect, select

from sentinel.coordinator.store.schema import metadata

if TYPE_CHECKING:
    from alembic.config import Config

    from sentinel.coordinator.store.base import SqlBase

MIGRATION_LOCK = 7305114  # PostgreSQL advisory lock id: one replica migrates at a time

# Alembic is imported where it is used (a command that opens no store never loads it), and its
# INFO lines (its plugins as it is first imported, its context) would otherwise greet every start.
logging.getLogger("alembic").setLevel(logging.WARNING)


def _config(store: SqlBase | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    if store is not None:
        cfg.attributes["connection"] = store.conn
    return cfg


def head() -> str:
    """The revision this build's schema is."""
    from alembic.script import ScriptDirectory

    found = ScriptDirectory.from_config(_config()).get_current_head()
    assert found is not None
    return found


def _known(rev: str) -> bool:
    from alembic.script import ScriptDirectory

    try:
        return ScriptDirectory.from_config(_config()).get_revision(rev) is not None
    except Exception:  # alembic's own error for a revision it does not know
        return False


def revision(store: SqlBase) -> str | None:
    """The revision the database is at (None: not versioned by Alembic)."""
    from alembic.runtime.migration import MigrationContext

    _config()
    return MigrationContext.configure(store.conn).get_current_revision()


def migrate(store: SqlBase) -> str:
    """Bring the database to this build's schema; the revision it is at."""
    from alembic import command

    newest = head()
    with store.tx():
        conn = store.conn
        if conn.dialect.name == "postgresql":
            conn.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK)))
        tables = set(inspect(conn).get_table_names())
        current = revision(store)
        if current is not None and not _known(current):
            raise RuntimeError(
                f"the store's schema is at revision {current}, newer than this build's ({newest}):"
                " upgrade Sentinel"
            )
        if current is None and "schema_version" not in tables:
            metadata.create_all(conn)
            command.stamp(_config(store), "head")
        elif current != newest:
            command.upgrade(_config(store), "head")
    return newest
