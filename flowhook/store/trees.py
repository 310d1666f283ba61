"""Run trees: every run a top-level run's ``flow`` steps started, theirs in turn, and the parts
(branches, map items) of all of them name that top-level run in ``runs.tree_run_id``.
``run_trees`` holds, per tree that started a child run, how many it started (bounded by
``FLOWHOOK_MAX_RUN_TREE``) and when the whole tree was cancelled (after which none of its
runs may start another). Migration 0025 says why."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, case, cast, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.children import UNLEASED, cancelled_values
from flowhook.store.driver import driver_of
from flowhook.store.guards import ACTIVE_RUN
from flowhook.store.models import Run, RunStatus, run_duration_ms
from flowhook.store.runs import RUN_COLUMNS
from flowhook.store.tables import run_trees, runs

__all__ = ["take_child", "cancel_tree", "TreeCancel"]


def _upsert(conn: AsyncConnection) -> Any:
    """The backend's ``INSERT`` of ``run_trees``, which takes ``on_conflict_do_update``."""
    return driver_of(conn).upsert(run_trees)


async def take_child(conn: AsyncConnection, tree_run_id: str, budget: int) -> str | None:
    """Count one more child run in the tree of ``tree_run_id``, in the caller's transaction
    (the one that inserts the child). ``None`` when it may start; else why not: the budget is
    spent, or the tree was cancelled."""
    insert = _upsert(conn).values(run_id=tree_run_id, runs=1)
    insert = insert.on_conflict_do_update(
        index_elements=[run_trees.c.run_id],
        set_={"runs": run_trees.c.runs + 1},
        where=(run_trees.c.runs < budget) & run_trees.c.cancelled_at.is_(None),
    ).returning(run_trees.c.runs)
    if (await conn.execute(insert)).first() is not None:
        return None
    q = select(run_trees.c.cancelled_at).where(run_trees.c.run_id == tree_run_id)
    if (await conn.execute(q)).scalar() is not None:
        return "cancelled"
    return "budget"


@dataclass(slots=True)
class TreeCancel:
    ended: list[Run]
    """The runs of the tree cancelled here (no worker held them)."""
    flagged: int
    """The runs a worker holds, flagged: each worker ends its own within a second."""


def _duration_ms(conn: AsyncConnection, now: datetime) -> ColumnElement[int]:
    """A run's ``duration_ms`` when it is cancelled at ``now``, in SQL: as
    `run_duration_ms` reckons it."""
    ms = driver_of(conn).milliseconds_since(now, runs.c.started_at)
    return case((runs.c.started_at.is_(None), None), else_=cast(ms, BigInteger))


async def cancel_tree(conn: AsyncConnection, tree_run_id: str, now: datetime) -> TreeCancel:
    """Cancel every unfinished run of the tree of ``tree_run_id`` (not that run itself), in a
    fixed number of statements whatever the tree's size: the tree is marked cancelled (none
    of its runs starts another child from now on), the runs no worker holds end
    ``cancelled``, the others are flagged (their workers end them, and their children)."""
    mark = _upsert(conn).values(run_id=tree_run_id, runs=0, cancelled_at=now)
    await conn.execute(
        mark.on_conflict_do_update(
            index_elements=[run_trees.c.run_id],
            set_={"cancelled_at": func.coalesce(run_trees.c.cancelled_at, now)},
        )
    )
    mine = (runs.c.tree_run_id == tree_run_id, text(ACTIVE_RUN))
    found = {
        r.run_id: r
        for r in map(Run.from_row, (await conn.execute(select(*RUN_COLUMNS).where(*mine))).all())
    }
    if not found:
        return TreeCancel([], 0)
    stopped = await conn.execute(
        update(runs)
        .where(*mine, *UNLEASED)
        .values(cancelled_values(now, _duration_ms(conn, now)))
        .returning(runs.c.run_id)
    )
    ended: list[Run] = []
    for (run_id,) in stopped.all():
        run = found.pop(run_id, None)
        if run is not None:
            run.duration_ms = run_duration_ms(run, now)  # as the statement wrote it
            run.status, run.finished_at, run.cancel_requested_at = (
                RunStatus.CANCELLED, now, now,
            )  # fmt: skip
            ended.append(run)
    flagged = await conn.execute(
        update(runs)
        .where(*mine)
        .values(cancel_requested_at=func.coalesce(runs.c.cancel_requested_at, now))
    )
    return TreeCancel(ended, flagged.rowcount)
