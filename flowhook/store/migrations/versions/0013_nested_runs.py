"""runs inside runs: sub-flow children and the parts of parallel and map steps

Revision ID: 0013
Revises: 0012

A ``flow`` step starts a child run (``parent_run_id``, ``parent_idx``: the run and the step
that wait for it). A ``parallel`` branch or a ``map`` item runs as a *part*: a row of
``runs`` with ``root_run_id`` (the run people see), ``parent_run_id``/``parent_idx`` (the row
and step that hold it) and ``scope`` (which branch or item it is), claimed by any worker like
a run. Columns are added nullable, which rewrites no table; the index is partial, so plain
runs cost it nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import JSONType

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_WHERE = "parent_run_id IS NOT NULL"


def upgrade() -> None:
    op.add_column("runs", sa.Column("parent_run_id", sa.String(length=40), nullable=True))
    op.add_column("runs", sa.Column("parent_idx", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("root_run_id", sa.String(length=40), nullable=True))
    op.add_column("runs", sa.Column("scope", JSONType, nullable=True))
    op.create_index(
        "ix_runs_parent",
        "runs",
        ["parent_run_id", "parent_idx", "run_id"],
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ix_runs_parent", table_name="runs")
    parts = "SELECT run_id FROM runs WHERE root_run_id IS NOT NULL"
    op.execute(f"DELETE FROM run_steps WHERE run_id IN ({parts})")
    op.execute("DELETE FROM runs WHERE root_run_id IS NOT NULL")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in ("scope", "root_run_id", "parent_idx", "parent_run_id"):
            batch_op.drop_column(column)
