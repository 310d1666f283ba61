"""Retention: finished runs older than ``FLOWHOOK_RETENTION_DAYS`` go, with their history,
and so do signals sent before then."""

from __future__ import annotations

from datetime import timedelta

from flowhook.clock import Clock
from flowhook.store import retention as store
from flowhook.store.db import Database

__all__ = ["RetentionService", "BATCH"]

BATCH = 500


class RetentionService:
    def __init__(self, db: Database, clock: Clock, days: float) -> None:
        self._db = db
        self._clock = clock
        self._days = days

    async def prune(self, days: float | None = None) -> int:
        """Delete in batches of :data:`BATCH`, one short transaction each; the total removed."""
        before = self._clock.now() - timedelta(days=self._days if days is None else days)
        total = 0
        while True:
            async with self._db.transaction() as conn:
                removed = await store.prune_batch(conn, before, BATCH)
            total += removed
            if removed < BATCH:
                break
        while True:  # signals go by age, in their own batches
            async with self._db.transaction() as conn:
                if await store.prune_signals(conn, before, BATCH) < BATCH:
                    return total
