"""Runs started by a step of another run, and how the two meet: a ``flow`` step's child run,
and the *parts* of a ``parallel`` or ``map`` step (one per branch or item: a row of ``runs``
any worker claims, with ``root_run_id`` naming the run people see and ``scope`` saying which
branch or item it is).

The run waiting for them sleeps without a lease; their ends wake it. Its look at them and
their ends are serialised by a lock on it (an advisory lock on PostgreSQL, taken before any
``runs`` row as the lock order rule asks; SQLite has one writer), so an end is never missed:
either the waiting run's look sees it, or the wake-up finds that run asleep. A part looks at
its siblings after every write of its transaction (``Progress.after``), so of two parts
ending together the second sees the first ended.

Cancelling locks rows a worker holds (to flag them) before the canceller's own rows; two
such cascades crossing each other's workers could deadlock on PostgreSQL, which breaks the
tie and the group write retries (``WriteConflict``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.driver import driver_of
from flowhook.store.guards import ACTIVE_RUN, run_move
from flowhook.store.models import Run, RunStatus, RunStep, StepStatus, run_duration_ms
from flowhook.store.runs import NOTIFY_CHANNEL, RUN_COLUMNS, get_run_by_id
from flowhook.store.tables import run_steps, runs
from flowhook.store.types import HELD
from flowhook.store.wakeup import wake_at_commit

__all__ = [
    "lock_key",
    "lock_parent",
    "child_at",
    "children_of",
    "wake_parent",
    "cancel_children",
    "insert_parts",
    "parts_at",
    "part_ended",
    "nested_of",
    "with_nested",
    "branch_steps",
    "reached_branch_steps",
]


def lock_key(parent_run_id: str) -> str:
    """The key :func:`lock_parent` locks, to sort by among a group write's locks."""
    return f"children:{parent_run_id}"


async def lock_parent(conn: AsyncConnection, parent_run_id: str) -> None:
    """Serialise a parent's look at its children with their ends (in the write transaction
    that does either)."""
    await driver_of(conn).lock(conn, f"flowhook.{lock_key(parent_run_id)}")


async def child_at(conn: AsyncConnection, parent_run_id: str, parent_idx: int) -> Run | None:
    """The run the parent's step ``parent_idx`` started (the latest, if a crash made the step
    start one again before its record was written: it cannot, they share a commit)."""
    q = (
        select(*RUN_COLUMNS)
        .where(runs.c.parent_run_id == parent_run_id, runs.c.parent_idx == parent_idx)
        .order_by(runs.c.run_id.desc())
        .limit(1)
    )
    row = (await conn.execute(q)).first()
    return Run.from_row(row) if row else None


async def wake_parent(conn: AsyncConnection, parent_run_id: str, now: datetime) -> None:
    """The child of a sleeping parent ended: make the parent claimable now (a parent a worker
    holds is left alone: that worker looks at its child under the same lock). Call after
    :func:`lock_parent`."""
    await conn.execute(
        update(runs)
        .where(runs.c.run_id == parent_run_id, text(ACTIVE_RUN), runs.c.lease_owner.is_(None))
        .values(available_at=now, due_at=now)
    )
    await wake_at_commit(conn, "runs", NOTIFY_CHANNEL)


UNLEASED = (
    text(run_move((RunStatus.CANCELLED,), honour_cancel=False)),
    runs.c.lease_owner.is_(None),
)
"""Where a cancel may end a run itself: it may move to cancelled and no worker holds it."""


def cancelled_values(now: datetime, duration_ms: Any) -> dict[str, Any]:
    """The columns of a run a cancel ends (``duration_ms``: a value, or a SQL expression)."""
    return {
        "status": str(RunStatus.CANCELLED),
        "finished_at": now,
        "cancel_requested_at": now,
        "duration_ms": duration_ms,
        "held": None,  # its slot, if any, is the caller's to give on (control.free_slots)
    }


async def cancel_children(
    conn: AsyncConnection, run_ids: Sequence[str], now: datetime, *, idx: int | None = None
) -> list[Run]:
    """Cancel the unfinished runs that ``run_ids`` started (only step ``idx``'s, if given),
    and theirs: one no worker holds ends ``cancelled`` here, one a worker holds is flagged
    (that worker ends it within a second, and its children with it). The runs ended here,
    for the ``flow.cancelled`` of those that are runs (not parts)."""
    ended: list[Run] = []
    frontier = list(run_ids)
    first = True
    while frontier:
        q = select(*RUN_COLUMNS).where(runs.c.parent_run_id.in_(frontier), text(ACTIVE_RUN))
        if idx is not None and first:
            q = q.where(runs.c.parent_idx == idx)
        first = False
        found = [Run.from_row(r) for r in (await conn.execute(q)).all()]
        if not found:
            break
        for run in found:
            # the guard (no lease) makes this apply to no row a worker holds
            moved = await conn.execute(
                update(runs)
                .where(runs.c.run_id == run.run_id, *UNLEASED)
                .values(cancelled_values(now, run_duration_ms(run, now)))
            )
            if moved.rowcount == 1:
                run.status, run.finished_at, run.cancel_requested_at = (
                    RunStatus.CANCELLED, now, now,
                )  # fmt: skip
                run.duration_ms = run_duration_ms(run, now)
                ended.append(run)
                continue
            await conn.execute(
                update(runs)
                .where(runs.c.run_id == run.run_id, text(ACTIVE_RUN))
                .values(cancel_requested_at=func.coalesce(runs.c.cancel_requested_at, now))
            )
        frontier = [run.run_id for run in found]
    return ended


async def children_of(conn: AsyncConnection, run_id: str) -> dict[int, Run]:
    """The runs ``run_id``'s steps started, by the index of the step (the latest per step)."""
    q = select(*RUN_COLUMNS).where(runs.c.parent_run_id == run_id).order_by(runs.c.run_id)
    return {
        r.parent_idx: r
        for r in map(Run.from_row, (await conn.execute(q)).all())
        if r.parent_idx is not None
    }


async def insert_parts(conn: AsyncConnection, parts: Sequence[Run], *, released: int) -> None:
    """Queue the parts of a ``parallel`` or ``map`` step (in branch or item order); the first
    ``released`` are claimable now, the others wait for one before them to end (due never,
    :data:`~flowhook.store.types.HELD`)."""
    rows = []
    for i, part in enumerate(parts):
        row = part.to_row()
        if i >= released:
            row["available_at"] = row["due_at"] = HELD
        rows.append(row)
    for start in range(0, len(rows), 500):
        await bulk.insert(conn, runs, rows[start : start + 500])
    await wake_at_commit(conn, "runs", NOTIFY_CHANNEL)


async def parts_at(conn: AsyncConnection, parent_run_id: str, parent_idx: int) -> list[Run]:
    """The parts step ``parent_idx`` of ``parent_run_id`` started, in branch or item order."""
    q = (
        select(*RUN_COLUMNS)
        .where(runs.c.parent_run_id == parent_run_id, runs.c.parent_idx == parent_idx)
        .order_by(runs.c.run_id)
    )
    return [Run.from_row(r) for r in (await conn.execute(q)).all()]


def _siblings() -> Any:
    """The unfinished parts beside ``:me`` (bound: ``parent``, ``idx``, ``me``)."""
    return and_(
        runs.c.parent_run_id == bindparam("parent"),
        runs.c.parent_idx == bindparam("idx"),
        runs.c.run_id != bindparam("me"),
        text(ACTIVE_RUN),
    )


# Built once (a part's end runs them on every part's end): the next part held back, released;
# and whether any part beside it still goes.
_RELEASE_NEXT = (
    update(runs)
    .where(
        runs.c.run_id
        == select(runs.c.run_id)
        .where(_siblings(), runs.c.available_at == bindparam("held_until"))
        .order_by(runs.c.run_id)
        .limit(1)
        .scalar_subquery()
    )
    .values(available_at=bindparam("now_"), due_at=bindparam("now_"))
)
_ANOTHER_GOING = select(runs.c.run_id).where(_siblings()).order_by(runs.c.run_id.desc()).limit(1)


async def part_ended(conn: AsyncConnection, part: Run, status: RunStatus, now: datetime) -> None:
    """In the write that ends ``part``, after its own writes and those of the parts ending
    with it (under :func:`lock_parent`, taken first): a completed part releases the next item
    held back, and the last one to end wakes the step's run; a part that failed or was
    cancelled wakes it at once (it stops the others)."""
    assert part.parent_run_id is not None
    if status is RunStatus.COMPLETED:
        where = {"parent": part.parent_run_id, "idx": part.parent_idx, "me": part.run_id}
        released = await conn.execute(_RELEASE_NEXT, {**where, "held_until": HELD, "now_": now})
        if released.rowcount:
            await wake_at_commit(conn, "runs", NOTIFY_CHANNEL)
            return
        if (await conn.execute(_ANOTHER_GOING, where)).first() is not None:
            return  # another part is still going: the last one wakes the run
    await wake_parent(conn, part.parent_run_id, now)


async def nested_of(conn: AsyncConnection, run_id: str) -> list[tuple[Run, list[RunStep]]]:
    """Every part under ``run_id`` (its parts, theirs, …) with its step records."""
    found: list[tuple[Run, list[RunStep]]] = []
    frontier = [run_id]
    while frontier:
        q = (
            select(*RUN_COLUMNS)
            .where(runs.c.parent_run_id.in_(frontier), runs.c.root_run_id.is_not(None))
            .order_by(runs.c.run_id)
        )
        parts = [Run.from_row(r) for r in (await conn.execute(q)).all()]
        ids = [p.run_id for p in parts]
        steps: dict[str, list[RunStep]] = {i: [] for i in ids}
        for start in range(0, len(ids), 500):
            rows = await conn.execute(
                select(run_steps)
                .where(run_steps.c.run_id.in_(ids[start : start + 500]))
                .order_by(run_steps.c.run_id, run_steps.c.idx)
            )
            for row in rows.all():
                steps[row.run_id].append(RunStep.from_row(row))
        found.extend((p, steps[p.run_id]) for p in parts)
        frontier = ids
    return found


def with_nested(
    steps: list[RunStep], parts: list[tuple[Run, list[RunStep]]], run_id: str
) -> list[RunStep]:
    """A run's step records with its parts' steps after the step that started them, in
    branch or item order (nested as deep as they go), each marked with its ``parent`` and
    ``branch`` or ``index``."""
    by_holder: dict[tuple[str, int], list[tuple[Run, list[RunStep]]]] = {}
    for part, own in parts:
        if part.parent_run_id is not None and part.parent_idx is not None:
            by_holder.setdefault((part.parent_run_id, part.parent_idx), []).append((part, own))

    def ordered(holder: str, records: list[RunStep]) -> list[RunStep]:
        out: list[RunStep] = []
        for record in records:
            held = by_holder.get((holder, record.idx), [])
            if held:
                record = replace(record, parts=tuple((_key(p), p.status) for p, _ in held))
            out.append(record)
            for part, own in held:
                scope = part.scope or {}
                marked = [
                    replace(
                        s,
                        parent=record.step_id,
                        branch=scope.get("branch"),
                        index=scope.get("index"),
                        depth=record.depth + 1,
                    )
                    for s in own
                ]
                out.extend(ordered(part.run_id, marked))
        return out

    return ordered(run_id, steps)


def _key(part: Run) -> str | int | None:
    """A part's branch name or item index."""
    scope = part.scope or {}
    found: str | int | None = scope.get("branch", scope.get("index"))
    return found


async def branch_steps(conn: AsyncConnection, run_id: str, idxs: Sequence[int]) -> list[RunStep]:
    """The finished step records of the branches that ``run_id``'s ``parallel`` steps at
    ``idxs`` ran (what later steps reach as ``steps.<id>``), and of the branches of the
    ``parallel`` steps those branches ran, however deep: one read a level."""
    found: list[RunStep] = []
    frontier: dict[str, list[int]] = {run_id: list(idxs)}
    while frontier:
        holders = or_(
            *(
                and_(runs.c.parent_run_id == holder, runs.c.parent_idx.in_(at))
                for holder, at in frontier.items()
            )
        )
        parts = select(runs.c.run_id).where(holders).scalar_subquery()
        q = select(run_steps).where(
            run_steps.c.run_id.in_(parts), run_steps.c.status == "completed"
        )
        frontier = {}
        for row in (await conn.execute(q)).all():
            step = RunStep.from_row(row)
            found.append(step)
            if step.type == "parallel":  # completed: its own branches are reached too
                frontier.setdefault(row.run_id, []).append(step.idx)
    return found


async def reached_branch_steps(
    conn: AsyncConnection, run: Run, records: Sequence[RunStep]
) -> list[RunStep]:
    """The finished step records of the branches of the completed ``parallel`` steps among
    ``run``'s ``records``. A rerun reuses such a step without its parts: its branches ran in
    the run it reruns (or further back, when that run reused it too), found by step id along
    ``rerun_of``; a run pruned by retention takes its branches' records with it."""
    done = [s for s in records if _finished_parallel(s)]
    ran = [s.idx for s in done if not s.reused]
    found = await branch_steps(conn, run.run_id, ran) if ran else []
    wanted = {s.step_id for s in done if s.reused}
    source = run.rerun_of
    while wanted and source is not None:
        original = await get_run_by_id(conn, source)
        if original is None:
            break
        there = [s for s in original.steps if s.step_id in wanted and _finished_parallel(s)]
        ran = [s.idx for s in there if not s.reused]
        found += await branch_steps(conn, original.run_id, ran) if ran else []
        wanted = {s.step_id for s in there if s.reused}
        source = original.rerun_of
    return found


def _finished_parallel(step: RunStep) -> bool:
    return step.type == "parallel" and step.status is StepStatus.COMPLETED
