"""Take over a store made before Alembic: its `schema_version` table said 6 (SQLite) or 3
(PostgreSQL), the last versions of the migrations each backend kept on its own.

The one change of layout: events keep their arrival order in `seq`, the primary key (SQLite's
rowid, which the old layout used as its cursor, becomes `seq`; PostgreSQL's `seq` was already
there, unique), and `id` is a unique key. SQLite gains the leadership table PostgreSQL had.

Revision ID: 0001
"""

from alembic import op
from sqlalchemy import text

from sentinel.coordinator.store.schema import events, leadership

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
LAST = {"sqlite": 6, "postgresql": 3}  # the legacy version this revision starts from


def upgrade() -> None:
    conn = op.get_bind()
    dialect = conn.dialect.name
    version = conn.execute(text("SELECT version FROM schema_version")).scalar()
    if version != LAST[dialect]:
        raise RuntimeError(
            f"the store's schema is at legacy version {version}; this build takes over only"
            f" version {LAST[dialect]}: open it with the Sentinel release before this one first"
        )
    if dialect == "sqlite":
        op.execute("ALTER TABLE events RENAME TO events_legacy")
        op.execute("DROP INDEX events_incident")
        op.execute("DROP INDEX events_kind_ts")
        events.create(conn)
        op.execute(
            "INSERT INTO events (seq, id, kind, node, rank, job, ts, payload, received_at,"
            " incident_id) SELECT rowid, id, kind, node, rank, job, ts, payload, received_at,"
            " incident_id FROM events_legacy"
        )
        op.execute("DROP TABLE events_legacy")
        leadership.create(conn)
    else:
        op.execute("ALTER TABLE events DROP CONSTRAINT events_pkey")
        op.execute("ALTER TABLE events DROP CONSTRAINT events_seq_key")
        op.execute("ALTER TABLE events ADD PRIMARY KEY (seq)")
        op.execute("ALTER TABLE events ADD CONSTRAINT events_id_key UNIQUE (id)")
    op.execute("DROP TABLE schema_version")


def downgrade() -> None:
    """Refused: the layout before Alembic belongs to releases that cannot open this store's
    later revisions anyway; going back is restoring the copy taken before the upgrade."""
    raise RuntimeError(
        "revision 0001 is not undone: restore the store from the copy taken before the upgrade"
    )
