"""Evidence bundles: one archive an incident, sealed before or beside its repair and never
replaced (`core/bundle.py`, `GET /v1/incidents/{id}/bundle`).

Revision ID: 0003
"""

from alembic import op

from sentinel.coordinator.store.schema import bundles

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bundles.create(op.get_bind())


def downgrade() -> None:
    bundles.drop(op.get_bind())
