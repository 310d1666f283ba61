"""claim runs and deliveries by when they fell due; record interrupted step attempts

Revision ID: 0008
Revises: 0007

``runs.due_at`` and ``deliveries.due_at`` keep the time a run or a delivery fell due, which a
claim no longer overwrites (it moves ``available_at`` / ``next_attempt_at`` to the lease's
end), so work claimed again after a crash is taken in its place, not behind the backlog.
``run_steps.interrupted`` lists the attempts of a step that started and never finished.

The new columns are added with a constant default, so adding them rewrites no table (SQLite
keeps the default in its schema; every write sets the column). Only the rows a claim can
take (queued or running runs, pending deliveries) are then filled from the columns they
replace for ordering: finished rows are never claimed again, and updating every row of a
large history would rewrite it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import JSONType, UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_EPOCH = "1970-01-01 00:00:00"


def _add_due_at(table: str, source: str, where: str) -> None:
    op.add_column(
        table,
        sa.Column("due_at", UTCDateTime(), nullable=False, server_default=sa.text(f"'{_EPOCH}'")),
    )
    op.execute(f"UPDATE {table} SET due_at = {source} WHERE {where}")
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(table, "due_at", server_default=None)
    op.create_index(
        f"ix_{table}_due_at",
        table,
        ["due_at"],
        unique=False,
        postgresql_where=sa.text(where),
        sqlite_where=sa.text(where),
    )


def upgrade() -> None:
    _add_due_at("runs", "available_at", "status IN ('queued', 'running')")
    _add_due_at("deliveries", "next_attempt_at", "status = 'pending'")
    op.add_column("run_steps", sa.Column("interrupted", JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_steps", schema=None) as batch_op:
        batch_op.drop_column("interrupted")
    for table in ("deliveries", "runs"):
        op.drop_index(f"ix_{table}_due_at", table_name=table)
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("due_at")
