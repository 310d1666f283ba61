"""rerun a finished run from one of its steps

Revision ID: 0009
Revises: 0008

``runs.rerun_of`` names the run a rerun starts from; ``run_steps.reused`` marks the steps a
rerun copied from it instead of running them again. Both are added with a constant default,
which rewrites no table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("rerun_of", sa.String(length=40), nullable=True))
    op.add_column(
        "run_steps",
        sa.Column("reused", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    with op.batch_alter_table("run_steps", schema=None) as batch_op:
        batch_op.drop_column("reused")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("rerun_of")
