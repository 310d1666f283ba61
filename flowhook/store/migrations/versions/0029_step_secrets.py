"""step_secrets: named values an ``http`` step reads as ``{{ secrets.NAME }}``

Revision ID: 0029
Revises: 0028

One row per workspace, mode and name; ``value`` sealed with FLOWHOOK_SECRET_KEY like the
endpoints' and hooks' secrets (``flowhook secrets rotate`` reseals these too).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import IdType, UTCDateTime

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_secrets",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("workspace_id", IdType(), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_step_secrets"),
        sa.UniqueConstraint(
            "workspace_id", "mode", "name", name="uq_step_secrets_workspace_id_mode_name"
        ),
    )


def downgrade() -> None:
    op.drop_table("step_secrets")
