"""The coordinator's durable state: one interface (`StateStore`), typed rows, and backends.

`SqliteStore` (alias `Store`) is the embedded default. A second backend is a module beside
`sqlite.py` implementing `StateStore`.
"""

from __future__ import annotations

from sentinel.coordinator.store.interface import MAX_ID, STATE_WRITERS, StateStore
from sentinel.coordinator.store.sqlite import MIGRATIONS, SqliteStore, Store, dumps, wal_path

__all__ = [
    "MAX_ID",
    "MIGRATIONS",
    "STATE_WRITERS",
    "SqliteStore",
    "StateStore",
    "Store",
    "dumps",
    "wal_path",
]
