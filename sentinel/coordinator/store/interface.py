"""What the store promises beyond its methods: id range, which methods write a state, and how
it fails. The methods themselves, with the SQL every backend shares, are `sql.SqlStore`.

The methods named in `STATE_WRITERS` write a state column. Only `lifecycle.py` calls them.
"""

from __future__ import annotations

STATE_WRITERS = frozenset(
    {
        "set_state",
        "insert_incident",
        "insert_run",
        "insert_step",
        "insert_node",
        "insert_job",
        "insert_effect",
    }
)
MAX_ID = 2**63 - 1  # ids are signed 64-bit integers in every backend


class StoreUnavailable(RuntimeError):
    """The database cannot be reached (or went away mid-transaction): nothing of the work in
    hand was committed. The API answers 503 with Retry-After; clients try again."""


class Fenced(RuntimeError):
    """The database refused a write made under a leadership epoch that is no longer the
    leader's: this coordinator was deposed and must step down."""
