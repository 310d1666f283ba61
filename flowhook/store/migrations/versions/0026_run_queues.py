"""the runs queue by workspace and mode, so that claims take turns across tenants

Revision ID: 0026
Revises: 0025

Audit 2, "also seen": claims took due runs by priority, then due time, across every
workspace, so one tenant's backlog (the 10,000 runs of a self-calling tree, or a burst of
priority-100 runs) came before another tenant's one run, which waited seconds. Claims now
take turns across (workspace, mode) queues, priority and due time ordering each queue's own
runs (``flowhook.store.runs.claim_runs``). This index is those queues in that order: a claim
steps from one workspace to the next in it (one probe each, whatever the backlog) and reads
each queue's due runs from it. It replaces ``ix_runs_priority`` and ``ix_runs_due_at``, which
only the old claim read: a plan that could take ``ix_runs_due_at`` for a queue's due runs
(PostgreSQL's generic plan did) passed over every other queue's, and a run pays for one
index less than two.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_ACTIVE = "status IN ('queued', 'running')"


def upgrade() -> None:
    op.create_index(
        "ix_runs_queue",
        "runs",
        ["workspace_id", "mode", sa.text("priority DESC"), "due_at"],
        postgresql_where=sa.text(_ACTIVE),
        sqlite_where=sa.text(_ACTIVE),
    )
    op.drop_index("ix_runs_priority", table_name="runs")
    op.drop_index("ix_runs_due_at", table_name="runs")


def downgrade() -> None:
    op.create_index(
        "ix_runs_due_at",
        "runs",
        ["due_at"],
        postgresql_where=sa.text(_ACTIVE),
        sqlite_where=sa.text(_ACTIVE),
    )
    op.create_index(
        "ix_runs_priority",
        "runs",
        [sa.text("priority DESC"), "due_at"],
        postgresql_where=sa.text(f"priority <> 0 AND {_ACTIVE}"),
        sqlite_where=sa.text(f"priority <> 0 AND {_ACTIVE}"),
    )
    op.drop_index("ix_runs_queue", table_name="runs")
