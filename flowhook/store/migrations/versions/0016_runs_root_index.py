"""runs: a partial index on root_run_id

Revision ID: 0016
Revises: 0015

A run's parts (the branches of a ``parallel``, the items of a ``map``) name the run people see
in ``root_run_id``. A nested approval or a signal aimed at the root run is found through it;
without an index that was a scan of the whole runs table. Partial: plain runs (most of the
table) are not in it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_WHERE = "root_run_id IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_runs_root",
        "runs",
        ["root_run_id"],
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_root", table_name="runs")
