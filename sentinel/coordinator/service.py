"""Where `benchmarks/failover.py` opens a store (`store.open_store`) until it imports it there."""

from sentinel.coordinator.store import open_store

__all__ = ["open_store"]
