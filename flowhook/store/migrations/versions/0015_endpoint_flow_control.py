"""webhook endpoints: rate_limit, fifo ordering and a filter by flow

Revision ID: 0015
Revises: 0014

``rate_limit`` (deliveries a second) with ``rate_next_at`` (when the endpoint's next
delivery may go, shared by every dispatcher), ``ordering`` (``fifo``: one delivery in flight,
in event order) and ``filter_flow_ids`` (only events of those flows). All nullable: nothing
is rewritten and endpoints without them behave as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import JSONType, UTCDateTime

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_endpoints", sa.Column("rate_limit", sa.Float(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("rate_next_at", UTCDateTime(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("ordering", sa.String(length=8), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("filter_flow_ids", JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("webhook_endpoints", schema=None) as batch_op:
        for column in ("filter_flow_ids", "ordering", "rate_next_at", "rate_limit"):
            batch_op.drop_column(column)
