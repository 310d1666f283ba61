"""The disk budget (``FLOWHOOK_DISK_BUDGET_MB``, issue 54): what the database takes against
it, and how many of the oldest finished runs retention deletes ahead of their age to get
back under it (:meth:`flowhook.service.retention.RetentionService.keep_to_budget`).

What counts is :class:`flowhook.store.space.Usage`'s ``database_bytes``: on SQLite the main
file and its WAL (free pages an incremental database gives back do not count), on
PostgreSQL ``pg_database_size`` less the space vacuum left free in the tables (estimated).
Past the budget, retention deletes down to :data:`MARGIN` of it, so the next few runs do not
take it over again at once.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from flowhook.errors import StoreUnavailable
from flowhook.store import space
from flowhook.store.db import Database

__all__ = ["MARGIN", "DiskStatus", "DiskService", "to_delete", "megabytes"]

MARGIN = 0.9
"""Past the budget, retention deletes until the database is under this share of it."""

FRESH = 5.0
"""Seconds a reading of the database's size is reused (the health answer may be asked
often; on PostgreSQL the size walks the database's files)."""

MIB = 1024 * 1024


def to_delete(database_bytes: int, budget_bytes: int, runs: int, margin: float = MARGIN) -> int:
    """How many of the oldest finished runs one round deletes: the share of ``runs`` (all the
    runs in the database) that the bytes over ``margin`` of the budget are of the database,
    rounded up, as if every run took as much as every other. The bytes the database takes
    without any run count as the runs', so a round deletes fewer than would be needed, never
    more; the next round measures again. 0 when it is under ``margin`` of the budget or holds
    no runs."""
    target = int(budget_bytes * margin)
    if database_bytes <= target or runs <= 0 or database_bytes <= 0:
        return 0
    return min(runs, math.ceil(runs * (database_bytes - target) / database_bytes))


def megabytes(n: int) -> str:
    """``612 MB`` (MiB, rounded; ``0.4 MB`` under one)."""
    mb = n / MIB
    return f"{mb:,.0f} MB" if mb >= 1 else f"{mb:.1f} MB"


@dataclass(frozen=True, slots=True)
class DiskStatus:
    """The database's use against the budget, as the health answer, ``/metrics`` and the
    overview report it."""

    database_bytes: int | None
    """``None``: the store did not answer."""
    budget_bytes: int | None
    """``None``: no budget set."""

    @property
    def over_budget(self) -> bool | None:
        if self.budget_bytes is None:
            return False
        if self.database_bytes is None:
            return None
        return self.database_bytes > self.budget_bytes

    @property
    def share(self) -> float | None:
        """Percent of the budget in use (may pass 100); ``None`` without a budget or size."""
        if self.budget_bytes is None or self.database_bytes is None:
            return None
        return 100.0 * self.database_bytes / self.budget_bytes

    def as_json(self) -> dict[str, int | bool | None]:
        return {
            "database_bytes": self.database_bytes,
            "budget_bytes": self.budget_bytes,
            "over_budget": self.over_budget,
        }


class DiskService:
    """Reads :class:`DiskStatus`, reusing a reading for :data:`FRESH` seconds."""

    def __init__(self, db: Database, budget_bytes: int | None) -> None:
        self._db = db
        self.budget_bytes = budget_bytes
        self._last: tuple[float, int] | None = None
        self._lock = asyncio.Lock()

    async def status(self, *, timeout: float = 2.0) -> DiskStatus:
        """The use against the budget now (or up to :data:`FRESH` seconds ago); the size is
        ``None`` when the store does not answer within ``timeout`` seconds."""
        async with self._lock:
            last = self._last
            if last is None or time.monotonic() - last[0] > FRESH:
                try:
                    async with asyncio.timeout(timeout), self._db.read() as conn:
                        found = await space.usage(conn)
                except (StoreUnavailable, TimeoutError, OSError):  # answered without the figure
                    return DiskStatus(None, self.budget_bytes)
                last = self._last = (time.monotonic(), found.database_bytes)
        return DiskStatus(last[1], self.budget_bytes)

    def forget(self) -> None:
        """The next :meth:`status` reads again (after retention changed the size)."""
        self._last = None
