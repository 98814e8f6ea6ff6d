"""Playbook modes: an operator's switch of a playbook between shadow and acting
(`PUT /v1/playbooks/{name}/mode`, `sentinel playbooks shadow|act NAME`).

Revision ID: 0002
"""

from alembic import op

from sentinel.coordinator.store.schema import playbook_modes

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    playbook_modes.create(op.get_bind())


def downgrade() -> None:
    playbook_modes.drop(op.get_bind())
