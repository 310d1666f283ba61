"""inbound hooks

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import JSONType, UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inbound_dedup",
        sa.Column("hook_id", sa.String(length=40), nullable=False),
        sa.Column("delivery_key", sa.String(length=200), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("hook_id", "delivery_key", name=op.f("pk_inbound_dedup")),
    )
    op.create_table(
        "inbound_hooks",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("flow_id", sa.String(length=40), nullable=False),
        sa.Column("verify", JSONType, nullable=True),
        sa.Column("dedup_header", sa.String(length=100), nullable=True),
        sa.Column("rate_limit", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbound_hooks")),
    )
    with op.batch_alter_table("inbound_hooks", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_inbound_hooks_workspace_id_mode_id"),
            ["workspace_id", "mode", "id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("inbound_hooks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_inbound_hooks_workspace_id_mode_id"))

    op.drop_table("inbound_hooks")
    op.drop_table("inbound_dedup")
