"""Pruning finished history in small batches (short transactions, no long locks)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.models import RunStatus
from flowhook.store.tables import (
    deliveries,
    delivery_attempts,
    events,
    inbound_dedup,
    run_steps,
    runs,
)

__all__ = ["prune_batch"]


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
    await conn.execute(delete(runs).where(runs.c.run_id.in_(ids)))
    return len(ids)
