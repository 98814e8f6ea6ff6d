"""The coordinator's durable state: the shared SQL (`sql.SqlStore`, which is also the store's
interface, `StateStore`), typed rows, and two backends: `SqliteStore` (alias `Store`), the
embedded default, and `PostgresStore`, which several coordinator replicas share.
"""

from __future__ import annotations

from sentinel.coordinator.store.interface import MAX_ID, STATE_WRITERS, Fenced, StoreUnavailable
from sentinel.coordinator.store.sql import SqlStore, dumps
from sentinel.coordinator.store.sqlite import MIGRATIONS, SqliteStore, Store, wal_path

StateStore = SqlStore

__all__ = [
    "MAX_ID",
    "MIGRATIONS",
    "STATE_WRITERS",
    "Fenced",
    "SqlStore",
    "SqliteStore",
    "StateStore",
    "Store",
    "StoreUnavailable",
    "dumps",
    "wal_path",
]
