"""flows' slugs: flows kept as code find their flow by a short name of their own

Revision ID: 0028
Revises: 0027

A definition may carry ``slug`` (``[a-z0-9-]{1,64}``): ``flowhook flows apply`` and
``GET /api/v1/flows?slug=`` find a flow by it. The current version's slug is kept on the flow's
row, unique among the workspace's and mode's flows that are not archived.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

_WHERE = "slug IS NOT NULL AND archived_at IS NULL"


def upgrade() -> None:
    op.add_column("flows", sa.Column("slug", sa.String(64), nullable=True))
    op.create_index(
        "ix_flows_slug",
        "flows",
        ["workspace_id", "mode", "slug"],
        unique=True,
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ix_flows_slug", table_name="flows")
    op.drop_column("flows", "slug")
