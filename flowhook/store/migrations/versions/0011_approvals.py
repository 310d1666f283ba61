"""approval steps: their single-use links (hashed) and decisions

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("approve_hash", sa.String(length=64), nullable=False),
        sa.Column("reject_hash", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=True),
        sa.Column("decision", sa.String(length=16), nullable=True),
        sa.Column("decided_by", sa.String(length=200), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("decided_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "idx", name=op.f("pk_approvals")),
        sa.UniqueConstraint("approve_hash", name=op.f("uq_approvals_approve_hash")),
        sa.UniqueConstraint("reject_hash", name=op.f("uq_approvals_reject_hash")),
    )


def downgrade() -> None:
    op.drop_table("approvals")
