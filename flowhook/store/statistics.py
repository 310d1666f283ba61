"""Planner statistics on PostgreSQL, gathered as the tables a process writes grow.

A prepared statement keeps its generic plan until something invalidates it, and an
``ANALYZE`` of a table it reads does. A plan made while a table held a hundred rows reads it
with a sequential scan; once it holds ten thousand, every execution still does. After a
burst of 10,000 runs the delivery completion read all of ``deliveries`` and
``delivery_attempts`` twice per batch, and execute → webhook took 13–28 ms instead of 6
(issue 18). Autovacuum's analyze would mend that up to a minute later, when autovacuum is
on; :class:`StatisticsKeeper` asks for it at once."""

from __future__ import annotations

import asyncio
import math

from flowhook.store.db import Database

__all__ = ["FIRST_AFTER", "StatisticsKeeper"]

FIRST_AFTER = 100
"""Rows a process writes before it first makes sure the tables have statistics; it looks
again at ten times as many, then at a hundred times, and so on."""


class StatisticsKeeper:
    """Counts the rows this process writes to ``tables`` and, at :data:`FIRST_AFTER` of
    them and at each tenfold of that, has PostgreSQL analyze those of ``tables`` that lack
    statistics or changed past autovacuum's analyze threshold since their last analyze
    (:meth:`Database.gather_statistics`). Nothing on SQLite. The gathering runs as a task
    of its own: a writer never waits for it."""

    def __init__(self, db: Database, tables: tuple[str, ...]) -> None:
        self._db = db
        self.tables = tables
        self._written = 0
        self._next: float = math.inf if db.is_sqlite else FIRST_AFTER
        self.task: asyncio.Task[None] | None = None
        """The last gathering started (for tests and for :meth:`cancel`)."""

    def wrote(self, rows: int) -> None:
        """``rows`` more rows were written to the tables."""
        self._written += rows
        if self._written < self._next:
            return
        self._next = _tenfold_past(self._written)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._gather())

    async def _gather(self) -> None:
        if await self._db.gather_statistics(self.tables) is None:
            self._next = self._written + FIRST_AFTER  # unreachable now: try again soon

    def cancel(self) -> None:
        """Stop a gathering under way (an ``ANALYZE`` can wait for the next start)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _tenfold_past(written: int) -> int:
    """The first of FIRST_AFTER × 10ⁿ greater than ``written``."""
    threshold = FIRST_AFTER
    while threshold <= written:
        threshold *= 10
    return threshold
