"""Pruning finished history in small batches (short transactions, no long locks)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.guards import ACTIVE_RUN
from flowhook.store.models import RunStatus
from flowhook.store.tables import (
    approvals,
    deliveries,
    delivery_attempts,
    events,
    inbound_dedup,
    run_steps,
    runs,
    signals,
    waits,
)

__all__ = ["prune_batch", "prune_signals"]


async def prune_batch(conn: AsyncConnection, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` runs that ended before ``before``, with their steps, events,
    deliveries and attempts, and the inbound hook dedup records that point at them; returns
    how many runs went."""
    ids = list(
        (
            await conn.execute(
                select(runs.c.run_id)
                .where(
                    runs.c.status.in_(
                        [str(RunStatus.COMPLETED), str(RunStatus.FAILED), str(RunStatus.CANCELLED)]
                    ),
                    runs.c.finished_at < before,
                )
                .limit(limit)
            )
        ).scalars()
    )
    if not ids:
        return 0
    doomed = select(deliveries.c.id).where(deliveries.c.run_id.in_(ids))
    await conn.execute(delete(delivery_attempts).where(delivery_attempts.c.delivery_id.in_(doomed)))
    await conn.execute(delete(deliveries).where(deliveries.c.run_id.in_(ids)))
    await conn.execute(delete(events).where(events.c.run_id.in_(ids)))
    await conn.execute(delete(run_steps).where(run_steps.c.run_id.in_(ids)))
    await conn.execute(delete(inbound_dedup).where(inbound_dedup.c.run_id.in_(ids)))
    await conn.execute(delete(waits).where(waits.c.run_id.in_(ids)))
    await conn.execute(delete(approvals).where(approvals.c.run_id.in_(ids)))
    await conn.execute(delete(runs).where(runs.c.run_id.in_(ids)))
    return len(ids)


async def prune_signals(conn: AsyncConnection, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` signals sent before ``before``, except those a ``wait`` step of
    a run still going took (it reads the signal when it wakes); returns how many went."""
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
    return len(ids)
