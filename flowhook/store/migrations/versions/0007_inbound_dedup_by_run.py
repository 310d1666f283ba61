"""index inbound dedup records by run, so retention prunes them with their runs

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f("ix_inbound_dedup_run_id"), "inbound_dedup", ["run_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_inbound_dedup_run_id"), table_name="inbound_dedup")
