"""retention by index: finished runs by end time, deliveries by run, the clearing mark

Revision ID: 0019
Revises: 0018

Pruning read every run to find the finished ones older than the retention period, and every
delivery to find a pruned run's (no index on ``deliveries.run_id``): with a million runs a
batch of 200 took seconds, holding SQLite's single writer all along. Now each is a range of
an index. ``retention_marks`` remembers how far clearing delivered events' bodies has got, so
a pass starts there instead of reading the history again.

SQLite's auto-vacuum cannot be switched on by a migration (it needs a full ``VACUUM``, which
cannot run in a transaction): new databases are made with it, and ``flowhook vacuum``
converts an older one once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_runs_finished",
        "runs",
        ["finished_at"],
        postgresql_where=sa.text("finished_at IS NOT NULL"),
        sqlite_where=sa.text("finished_at IS NOT NULL"),
    )
    op.create_index("ix_deliveries_run_id", "deliveries", ["run_id"])
    op.create_table(
        "retention_marks",
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("value", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_retention_marks")),
    )


def downgrade() -> None:
    op.drop_table("retention_marks")
    op.drop_index("ix_deliveries_run_id", table_name="deliveries")
    op.drop_index("ix_runs_finished", table_name="runs")
