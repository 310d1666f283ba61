"""flow control per key: concurrency slots, throttle reservations, debounce, priority

Revision ID: 0014
Revises: 0013

A run keeps the keys read when it was accepted (``concurrency_key``, ``throttle_key``,
``debounce_key``), the concurrency slot it holds from admission to its end
(``concurrency_slot``), the start a throttle reserved for it (``throttle_at``), why it is held
back (``held``: concurrency, throttle or debounce) and its ``priority``. Every column but
``priority`` is nullable and every index partial, so runs of flows without flow control are
in none of them; ``priority`` has a constant default, which PostgreSQL stores without
rewriting the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_INDEXES: list[tuple[str, list[str], str]] = [
    ("ix_runs_priority", ["priority DESC", "due_at"],
     "priority <> 0 AND status IN ('queued', 'running')"),
    ("ix_runs_slots", ["flow_id", "concurrency_slot"], "concurrency_slot IS NOT NULL"),
    ("ix_runs_held", ["flow_id", "concurrency_key", "priority DESC", "run_id"],
     "held = 'concurrency'"),
    ("ix_runs_throttle", ["flow_id", "throttle_key", "throttle_at"], "throttle_at IS NOT NULL"),
    ("ix_runs_debounce", ["flow_id", "debounce_key"], "held = 'debounce'"),
]  # fmt: skip


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="0")
    )
    for name in ("concurrency_key", "concurrency_slot", "throttle_key", "debounce_key"):
        op.add_column("runs", sa.Column(name, sa.String(length=255), nullable=True))
    op.add_column("runs", sa.Column("held", sa.String(length=16), nullable=True))
    op.add_column("runs", sa.Column("throttle_at", UTCDateTime(), nullable=True))
    for name, columns, where in _INDEXES:
        op.create_index(
            name,
            "runs",
            [sa.text(c) for c in columns],
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )


def downgrade() -> None:
    for name, _, _ in reversed(_INDEXES):
        op.drop_index(name, table_name="runs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in (
            "throttle_at", "held", "debounce_key", "throttle_key", "concurrency_slot",
            "concurrency_key", "priority",
        ):  # fmt: skip
            batch_op.drop_column(column)
