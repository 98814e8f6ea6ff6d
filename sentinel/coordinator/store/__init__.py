"""The coordinator's durable state: one schema (`schema.py`, SQLAlchemy Core) for both
databases, one migration runner (`migrate.py`, Alembic), repositories per aggregate gathered in
`sql.SqlStore` (which implements the repair core's interface, `core.store.StateStore`), and two
backends: `SqliteStore`, the embedded default, and `PostgresStore`, which
several coordinator replicas share, with the lease that says which of them leads (`lease.py`).
"""

from __future__ import annotations

from sentinel.config import CoordinatorConfig
from sentinel.coordinator.store.lease import Leadership, LeaseLeadership, SoleLeadership
from sentinel.coordinator.store.sql import SqlStore
from sentinel.coordinator.store.sqlite import SqliteStore, wal_path

STORE_FILE = "coordinator.db"  # SQLite's file in the state directory

__all__ = ["STORE_FILE", "SqlStore", "SqliteStore", "open_store", "wal_path"]


def open_store(cfg: CoordinatorConfig) -> tuple[SqlStore, Leadership]:
    """The store the config names and who leads on it: SQLite in the state directory (one
    coordinator, always the leader), or a shared PostgreSQL (a lease decides)."""
    if cfg.store is None:
        return SqliteStore(cfg.state_dir / STORE_FILE), SoleLeadership()
    from sentinel.coordinator.store.postgres import PostgresStore

    store = PostgresStore(cfg.store, cfg.store_password_file)
    return store, LeaseLeadership(store, cfg.lease_ttl_s)
