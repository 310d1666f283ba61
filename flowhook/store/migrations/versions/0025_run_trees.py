"""run trees: the budget of sub-flow runs one run may start, and cancelling a whole tree

Revision ID: 0025
Revises: 0024

Audit 2, finding 2: a flow that calls itself (``wait: false``) from a 4-item map made 8,272
runs in 85 s and was still growing; depth alone allows 4^10. Every nested run (a ``flow``
step's child, a ``parallel`` branch or ``map`` item) now names the top-level run its tree
grew from (``runs.tree_run_id``; NULL for a top-level run, so the API's inserts and the
partial index are unchanged for them), and ``run_trees`` counts the child runs each tree
started, one row per tree that started any: the ``flow`` step takes one from the budget
(``FLOWHOOK_MAX_RUN_TREE``) in the transaction that inserts the child, and a tree cancelled
whole (``POST /api/v1/flows/runs/{id}/cancel`` with ``{"tree": true}``) is marked there, so
no run of it can start another afterwards. Runs written before this revision have no tree id;
their descendants are found by ``parent_run_id`` as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from flowhook.store.types import IdType, UTCDateTime

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_WHERE = "tree_run_id IS NOT NULL"


def upgrade() -> None:
    op.add_column("runs", sa.Column("tree_run_id", IdType(), nullable=True))
    op.create_index(
        "ix_runs_tree",
        "runs",
        ["tree_run_id"],
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )
    op.create_table(
        "run_trees",
        sa.Column("run_id", IdType(), primary_key=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("cancelled_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("run_trees")
    op.drop_index("ix_runs_tree", table_name="runs")
    op.drop_column("runs", "tree_run_id")
