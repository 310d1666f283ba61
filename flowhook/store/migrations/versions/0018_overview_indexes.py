"""indexes for the overview page

Revision ID: 0018
Revises: 0017

The settings screen's overview page (flowhook/store/overview.py) counts a workspace's runs by
status and time, reads completed runs' durations by flow, and counts what waits in the queues;
each read is a range of one of these indexes, so the page costs the same with a million runs
as with a hundred. All are partial: the parts of a ``parallel`` or ``map`` step are not in
the first two, and only queued runs and pending deliveries are in the last two (small, and
rows leave them when they move on).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_INDEXES: list[tuple[str, str, list[str], str]] = [
    ("ix_runs_overview", "runs", ["workspace_id", "mode", "status", "queued_at"],
     "root_run_id IS NULL"),
    ("ix_runs_completed", "runs", ["flow_id", "finished_at", "duration_ms"],
     "status = 'completed' AND root_run_id IS NULL"),
    ("ix_runs_queued", "runs", ["workspace_id", "mode", "due_at"], "status = 'queued'"),
    ("ix_deliveries_pending", "deliveries", ["workspace_id", "mode", "created_at"],
     "status = 'pending'"),
]  # fmt: skip


def upgrade() -> None:
    for name, table, columns, where in _INDEXES:
        op.create_index(
            name, table, columns, postgresql_where=sa.text(where), sqlite_where=sa.text(where)
        )


def downgrade() -> None:
    for name, table, _, _ in reversed(_INDEXES):
        op.drop_index(name, table_name=table)
