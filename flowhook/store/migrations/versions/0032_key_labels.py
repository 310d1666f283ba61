"""API keys get a label and the time they were last used

Revision ID: 0032
Revises: 0031

``flowhook keys create --label "CI deploys"`` (and the settings screen's Keys page) name a
key, so that "approved by" and the keys list say which key in words;
``last_used_at`` is written by each API process at most every half minute per key, from the
uses it counted in memory (no write on the request path).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import UTCDateTime

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("label", sa.String(100), nullable=True))
    op.add_column("api_keys", sa.Column("last_used_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "last_used_at")
    op.drop_column("api_keys", "label")
