"""Pruning finished history in small batches (short transactions, no long locks).

Each read here is a range of an index, so a batch costs the same with a million runs in the
table as with a hundred: finished runs by ``finished_at`` (``ix_runs_finished``), a run's
rows by ``run_id`` (deliveries through their events: ``ix_events_run_id``, then
``ix_deliveries_event_id``), events by their time-ordered
primary key from where the previous pass stopped (``retention_marks``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from sqlalchemy import delete, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.ids import id_floor
from flowhook.store.driver import driver_of
from flowhook.store.guards import ACTIVE_RUN
from flowhook.store.models import DeliveryStatus, RunStatus
from flowhook.store.tables import (
    approvals,
    deliveries,
    delivery_attempts,
    events,
    inbound_dedup,
    retention_marks,
    run_steps,
    runs,
    signals,
    tasks,
    waits,
    workers,
)

__all__ = [
    "prune_batch",
    "prune_oldest",
    "run_count",
    "prune_signals",
    "clear_delivered",
    "CLEARED_BODY",
    "EVENTS_CLEARED",
    "Step",
]

Step = Callable[[AsyncConnection, int], Awaitable[int]]
"""One batch of a retention pass, in the transaction given, of at most the size given: how
many rows it handled."""

CLEARED_BODY = b"null"
"""What a delivered event's body becomes after ``FLOWHOOK_DELIVERY_RETENTION_DAYS``: still
valid JSON wherever the body is shown, and never signed and sent again (replay refuses it)."""

EVENTS_CLEARED = "events_cleared"
"""The mark (``retention_marks``) below which events were looked at by :func:`clear_delivered`."""


async def prune_batch(conn: AsyncConnection, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` runs that ended before ``before``, with their steps, events,
    deliveries and attempts, and the inbound hook dedup records that point at them; returns
    how many runs went."""
    return await _prune_finished(conn, before, limit)


async def prune_oldest(conn: AsyncConnection, limit: int) -> int:
    """Delete up to ``limit`` of the oldest finished runs (by ``finished_at``), whatever their
    age, with everything :func:`prune_batch` deletes with them (the disk budget: runs still
    going are never touched); returns how many runs went."""
    return await _prune_finished(conn, None, limit)


_FINISHED = [str(RunStatus.COMPLETED), str(RunStatus.FAILED), str(RunStatus.CANCELLED)]


async def run_count(conn: AsyncConnection) -> int:
    """Runs in the table, finished or not (what the database's history is shared among)."""
    return int(await conn.scalar(select(func.count()).select_from(runs)) or 0)


async def _prune_finished(conn: AsyncConnection, before: datetime | None, limit: int) -> int:
    await _plan_for_pruning(conn)
    ended = runs.c.finished_at.is_not(None) if before is None else runs.c.finished_at < before
    ids = list(
        (
            await conn.execute(
                select(runs.c.run_id)
                .where(runs.c.status.in_(_FINISHED), ended)
                .order_by(runs.c.finished_at)  # ix_runs_finished, oldest first
                .limit(limit)
            )
        ).scalars()
    )
    if not ids:
        return 0
    # A delivery's run is its event's: the runs' deliveries are those of their events, read
    # once, then deleted by primary key.
    theirs = deliveries.c.event_id.in_(select(events.c.id).where(events.c.run_id.in_(ids)))
    doomed = list((await conn.execute(select(deliveries.c.id).where(theirs))).scalars())
    if doomed:
        await conn.execute(
            delete(delivery_attempts).where(delivery_attempts.c.delivery_id.in_(doomed))
        )
        await conn.execute(delete(deliveries).where(deliveries.c.id.in_(doomed)))
    await conn.execute(delete(events).where(events.c.run_id.in_(ids)))
    await conn.execute(delete(run_steps).where(run_steps.c.run_id.in_(ids)))
    await conn.execute(delete(inbound_dedup).where(inbound_dedup.c.run_id.in_(ids)))
    await conn.execute(delete(waits).where(waits.c.run_id.in_(ids)))
    await conn.execute(delete(approvals).where(approvals.c.run_id.in_(ids)))
    await conn.execute(delete(tasks).where(tasks.c.run_id.in_(ids)))
    await conn.execute(delete(runs).where(runs.c.run_id.in_(ids)))
    return len(ids)


async def _plan_for_pruning(conn: AsyncConnection) -> None:
    """On PostgreSQL, no merge joins in this transaction. Pruning deletes the oldest rows
    first, so until vacuum comes the low end of every id and time index is dead entries, and
    PostgreSQL before 16 estimates a merge join by reading the join keys' actual lowest and
    highest index entries, walking every dead one: finding a run's deliveries through its
    events (a semi-join) took far longer to plan than to run once many runs were pruned,
    more with every batch (bench/README.md, "Figures moved from docstrings"). The signals
    pass has a semi-join of the same kind. Their best plan is a nested loop over the indexes
    anyway."""
    await driver_of(conn).prefer_nested_loops(conn)


async def prune_signals(conn: AsyncConnection, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` signals sent before ``before``, except those a ``wait`` step of
    a run still going took (it reads the signal when it wakes), and the workers last seen
    before it; returns how many signals went."""
    await _plan_for_pruning(conn)
    taken = select(waits.c.signal_id).where(
        waits.c.signal_id.is_not(None),
        waits.c.run_id.in_(select(runs.c.run_id).where(text(ACTIVE_RUN))),
    )
    ids = list(
        (
            await conn.execute(
                select(signals.c.id)
                .where(signals.c.created_at < before, signals.c.id.not_in(taken))
                .limit(limit)
            )
        ).scalars()
    )
    if ids:
        await conn.execute(delete(signals).where(signals.c.id.in_(ids)))
    if len(ids) < limit:  # and the workers not seen since ``before`` (a row per worker id)
        await conn.execute(delete(workers).where(workers.c.last_seen_at < before))
    return len(ids)


async def clear_delivered(
    conn: AsyncConnection, before: datetime, oldest: datetime, limit: int
) -> int:
    """Clear the bodies of up to ``limit`` events created before ``before`` that no delivery
    still needs (none of theirs is pending or failed: a failed one keeps its event's body
    until its run is pruned, so it can be replayed), and the response excerpts of their
    succeeded deliveries' attempts. Events are read in id (creation) order from the mark the
    previous call left, or from ``oldest`` (what run retention keeps) the first time; returns
    how many events were looked at (fewer than ``limit``: the pass is done)."""
    mark = await conn.scalar(
        select(retention_marks.c.value).where(retention_marks.c.name == EVENTS_CLEARED)
    )
    # Ids are unique and no event's id is a floor (its random bits are never all zero), so
    # "after the mark" is exact whether the mark is the last event looked at or a floor.
    after = max(mark or "", id_floor("evt", int(oldest.timestamp() * 1000)))
    stop = id_floor("evt", int(before.timestamp() * 1000))
    if after >= stop:
        return 0
    ids = list(
        (
            await conn.execute(
                select(events.c.id)
                .where(events.c.id > after, events.c.id < stop)
                .order_by(events.c.id)
                .limit(limit)
            )
        ).scalars()
    )
    held = select(deliveries.c.event_id).where(
        deliveries.c.event_id.in_(ids),
        deliveries.c.status.in_([str(DeliveryStatus.PENDING), str(DeliveryStatus.FAILED)]),
    )
    kept = set((await conn.execute(held)).scalars()) if ids else set()
    done = [i for i in ids if i not in kept]
    if done:
        await conn.execute(
            update(events)
            .where(
                events.c.id.in_(done),
                or_(events.c.body.is_(None), events.c.body != CLEARED_BODY),
            )
            # The payload goes too (the body is rebuilt from it otherwise): what stays is the
            # cleared body, which reads as JSON null and which replay refuses.
            .values(body=CLEARED_BODY, payload=CLEARED_BODY)
        )
        succeeded = select(deliveries.c.id).where(
            deliveries.c.event_id.in_(done),
            deliveries.c.status == str(DeliveryStatus.SUCCEEDED),
        )
        await conn.execute(
            update(delivery_attempts)
            .where(
                delivery_attempts.c.delivery_id.in_(succeeded),
                delivery_attempts.c.response_excerpt.is_not(None),
            )
            .values(response_excerpt=None)
        )
    await _set_mark(conn, ids[-1] if len(ids) == limit else stop, exists=mark is not None)
    return len(ids)


async def _set_mark(conn: AsyncConnection, value: str, *, exists: bool) -> None:
    if exists:
        await conn.execute(
            update(retention_marks)
            .where(retention_marks.c.name == EVENTS_CLEARED)
            .values(value=value)
        )
    else:
        await conn.execute(retention_marks.insert().values(name=EVENTS_CLEARED, value=value))
