"""inbound hooks that send a signal instead of starting a run

Revision ID: 0012
Revises: 0011

An inbound hook names either a flow (``flow_id``: each arrival starts a run) or a signal
(``signal``: each arrival's body is sent as that signal's ``data``). On SQLite, making
``flow_id`` nullable rebuilds ``inbound_hooks`` (a small table: one row per hook).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inbound_hooks", schema=None) as batch_op:
        batch_op.alter_column("flow_id", existing_type=sa.String(length=40), nullable=True)
        batch_op.add_column(sa.Column("signal", sa.String(length=200), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM inbound_hooks WHERE flow_id IS NULL")
    with op.batch_alter_table("inbound_hooks", schema=None) as batch_op:
        batch_op.drop_column("signal")
        batch_op.alter_column("flow_id", existing_type=sa.String(length=40), nullable=False)
