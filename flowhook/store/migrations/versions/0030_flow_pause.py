"""flows that are paused: their queued runs wait until the flow is resumed

Revision ID: 0030
Revises: 0029

``POST /api/v1/flows/{id}/pause`` sets ``flows.paused_at``; the flow still accepts executes,
whose runs are held (``runs.held = 'paused'``) with the runs queued before the pause, until
``/resume`` lets them go, oldest first.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import UTCDateTime

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("flows", sa.Column("paused_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    op.drop_column("flows", "paused_at")
