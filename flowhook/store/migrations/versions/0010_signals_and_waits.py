"""signals, and the wait steps they resolve

Revision ID: 0010
Revises: 0009

``signals`` keeps every signal sent (broadcast, or to one run) until retention prunes it, so
a run that reaches a ``wait`` step after its signal arrived still finds it. ``waits`` holds
one row per ``wait`` step a run reached: a signal that matches it records itself there and
wakes the run.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import JSONType, UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signals",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("data", JSONType, nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=True),
        sa.Column("dedup_key", sa.String(length=255), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signals")),
        sa.UniqueConstraint(
            "workspace_id", "mode", "dedup_key", name=op.f("uq_signals_workspace_id_mode_dedup_key")
        ),
    )
    op.create_index(
        op.f("ix_signals_workspace_id_mode_name_created_at"),
        "signals",
        ["workspace_id", "mode", "name", "created_at"],
    )
    op.create_index(op.f("ix_signals_run_id"), "signals", ["run_id"])
    op.create_index(op.f("ix_signals_created_at"), "signals", ["created_at"])
    op.create_table(
        "waits",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.String(length=40), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("match_keys", sa.Text(), nullable=False),
        sa.Column("match_digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("until", UTCDateTime(), nullable=True),
        sa.Column("signal_id", sa.String(length=40), nullable=True),
        sa.Column("resolved_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "idx", name=op.f("pk_waits")),
    )
    op.create_index(
        "ix_waits_open",
        "waits",
        ["workspace_id", "mode", "name", "match_keys", "match_digest"],
        postgresql_where=sa.text("resolved_at IS NULL"),
        sqlite_where=sa.text("resolved_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_waits_open", table_name="waits")
    op.drop_table("waits")
    op.drop_index(op.f("ix_signals_created_at"), table_name="signals")
    op.drop_index(op.f("ix_signals_run_id"), table_name="signals")
    op.drop_index(op.f("ix_signals_workspace_id_mode_name_created_at"), table_name="signals")
    op.drop_table("signals")
