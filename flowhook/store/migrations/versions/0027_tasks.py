"""tasks: the work of ``task`` steps, done by workers in the team's own code

Revision ID: 0027
Revises: 0026

A ``task`` step queues one row here and its run sleeps; a worker claims it
(``POST /api/v1/tasks/claim``), heartbeats it and completes or fails it, which wakes the run.
``workers`` remembers who claimed lately, for ``GET /api/v1/workers`` and the Workers page.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import IdType, JSONType, OptionalJSON, UTCDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("task_id", IdType(), primary_key=True),
        sa.Column("workspace_id", IdType(), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("run_id", IdType(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("root_run_id", IdType(), nullable=False),
        sa.Column("flow_id", IdType(), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("input", OptionalJSON),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("interrupted", OptionalJSON),
        sa.Column("available_at", UTCDateTime(), nullable=False),
        sa.Column("worker_id", sa.String(200)),
        sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
        sa.Column("attempt_deadline", UTCDateTime(), nullable=True),
        sa.Column("heartbeat_seconds", sa.Float(), nullable=False),
        sa.Column("timeout_seconds", sa.Float()),
        sa.Column("retryable", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("output", OptionalJSON),
        sa.Column("error", OptionalJSON),
        sa.Column("traceparent", sa.String(55)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("claimed_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("task_id", name="pk_tasks"),
        sa.UniqueConstraint("run_id", "idx", name="uq_tasks_run_id_idx"),
    )
    op.create_index(
        "ix_tasks_ready",
        "tasks",
        ["workspace_id", "mode", "task", "available_at"],
        postgresql_where=sa.text("status = 'queued'"),
        sqlite_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "ix_tasks_leased",
        "tasks",
        ["workspace_id", "mode", "lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
        sqlite_where=sa.text("status = 'running'"),
    )
    op.create_index("ix_tasks_root_run_id", "tasks", ["root_run_id"])
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("workspace_id", IdType(), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("tasks", JSONType, nullable=False),
        sa.Column("last_seen_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "workspace_id", "mode", name="pk_workers"),
    )
    op.create_index(
        "ix_workers_workspace_id_mode_last_seen_at",
        "workers",
        ["workspace_id", "mode", "last_seen_at"],
    )


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_table("tasks")
