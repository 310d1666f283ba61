"""webhook endpoints that are paused: their deliveries wait until the endpoint is resumed

Revision ID: 0031
Revises: 0030

``POST /api/v1/webhooks/endpoints/{id}/pause`` sets ``webhook_endpoints.paused_at``; the
endpoint's pending deliveries, and the ones queued while it is paused, are held (due never)
with no attempt used, until ``/resume`` lets them go, oldest first.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import UTCDateTime

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_endpoints", sa.Column("paused_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    op.drop_column("webhook_endpoints", "paused_at")
