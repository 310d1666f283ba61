"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import JSONType, UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("flow_id", sa.String(length=40), nullable=True),
        sa.Column("run_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_run_id_id"), ["run_id", "id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_events_workspace_id_mode_id"),
            ["workspace_id", "mode", "id"],
            unique=False,
        )

    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("flow_id", sa.String(length=40), nullable=False),
        sa.Column("flow_version", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("payload", JSONType, nullable=False),
        sa.Column("output", JSONType, nullable=True),
        sa.Column("error", JSONType, nullable=True),
        sa.Column("steps_executed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_step", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("queued_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("available_at", UTCDateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
        sa.Column("claims", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("cancel_requested_at", UTCDateTime(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
        sa.UniqueConstraint(
            "workspace_id",
            "mode",
            "idempotency_key",
            name=op.f("uq_runs_workspace_id_mode_idempotency_key"),
        ),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_claimable",
            ["available_at"],
            unique=False,
            postgresql_where=sa.text("status IN ('queued', 'running')"),
            sqlite_where=sa.text("status IN ('queued', 'running')"),
        )
        batch_op.create_index(
            batch_op.f("ix_runs_flow_id_run_id"), ["flow_id", "run_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_runs_workspace_id_mode_run_id"),
            ["workspace_id", "mode", "run_id"],
            unique=False,
        )

    op.create_table(
        "workspaces",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspaces")),
        sa.UniqueConstraint("name", name=op.f("uq_workspaces_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("prefix", sa.String(length=24), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_api_keys_workspace_id_workspaces"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "flows",
        sa.Column("flow_id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("archived_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_flows_workspace_id_workspaces"),
        ),
        sa.PrimaryKeyConstraint("flow_id", name=op.f("pk_flows")),
    )
    with op.batch_alter_table("flows", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_flows_workspace_id_mode_flow_id"),
            ["workspace_id", "mode", "flow_id"],
            unique=False,
        )

    op.create_table(
        "run_steps",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("step_id", sa.String(length=64), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("output", JSONType, nullable=True),
        sa.Column("error", JSONType, nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_run_steps_run_id_runs")),
        sa.PrimaryKeyConstraint("run_id", "idx", name=op.f("pk_run_steps")),
    )
    op.create_table(
        "flow_versions",
        sa.Column("flow_id", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("definition", JSONType, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["flow_id"], ["flows.flow_id"], name=op.f("fk_flow_versions_flow_id_flows")
        ),
        sa.PrimaryKeyConstraint("flow_id", "version", name=op.f("pk_flow_versions")),
    )


def downgrade() -> None:
    op.drop_table("flow_versions")
    op.drop_table("run_steps")
    with op.batch_alter_table("flows", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_flows_workspace_id_mode_flow_id"))

    op.drop_table("flows")
    op.drop_table("api_keys")
    op.drop_table("workspaces")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_workspace_id_mode_run_id"))
        batch_op.drop_index(batch_op.f("ix_runs_flow_id_run_id"))
        batch_op.drop_index(
            "ix_runs_claimable",
            postgresql_where=sa.text("status IN ('queued', 'running')"),
            sqlite_where=sa.text("status IN ('queued', 'running')"),
        )

    op.drop_table("runs")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_workspace_id_mode_id"))
        batch_op.drop_index(batch_op.f("ix_events_run_id_id"))

    op.drop_table("events")
