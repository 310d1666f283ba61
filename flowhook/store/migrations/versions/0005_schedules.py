"""schedules

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import JSONType, UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("flow_id", sa.String(length=40), nullable=False),
        sa.Column("cron", sa.String(length=120), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("payload", JSONType, nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("next_run_at", UTCDateTime(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
    )
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.create_index(
            "ix_schedules_due",
            ["next_run_at"],
            unique=False,
            postgresql_where=sa.text("enabled"),
            sqlite_where=sa.text("enabled"),
        )
        batch_op.create_index(
            batch_op.f("ix_schedules_workspace_id_mode_id"),
            ["workspace_id", "mode", "id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_schedules_workspace_id_mode_id"))
        batch_op.drop_index(
            "ix_schedules_due", postgresql_where=sa.text("enabled"), sqlite_where=sa.text("enabled")
        )

    op.drop_table("schedules")
