"""Where `benchmarks/failover.py` finds tokens (`core/auth.py`) until it imports them there."""

from sentinel.coordinator.core.auth import Role, TokenStore

__all__ = ["Role", "TokenStore"]
