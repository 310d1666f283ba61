"""runs: traceparent

Revision ID: 0017
Revises: 0016

The W3C trace context a run's span lives under (``00-<trace id>-<parent id>-<flags>``, 55
characters): the caller's ``traceparent`` on execute, or the step or run a child, part or
rerun belongs to. NULL for a run started without one: its trace id is derived from its run
id (see flowhook/tracing.py), so an execute without the header writes nothing more.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("traceparent")
