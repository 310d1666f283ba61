"""pending deliveries by endpoint, for the dispatcher's reads past busy endpoints

Revision ID: 0024
Revises: 0023

The dispatcher asks "when does the next delivery fall due?" leaving out the endpoints it
already holds as many deliveries of as it may (busy ones), and claims only when one of the
others has a delivery due. Read from ``ix_deliveries_due`` (``next_attempt_at``) that
question walked every pending delivery of the busy endpoints first: with a rate-limited
endpoint 30,000 deliveries behind, each read took ~1.5 ms and a healthy endpoint beside it
got two fifths of its deliveries a second. This index (pending rows only, so it stays small)
lets the read visit each endpoint that has pending deliveries once, whatever its backlog
(when the earliest pending deliveries are all the busy endpoints').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_NAME = "ix_deliveries_endpoint_due"
_WHERE = "status = 'pending'"


def upgrade() -> None:
    op.create_index(
        _NAME,
        "deliveries",
        ["endpoint_id", "next_attempt_at"],
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index(_NAME, table_name="deliveries")
