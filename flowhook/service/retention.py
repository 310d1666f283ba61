"""Retention, by kind:

- finished runs older than ``FLOWHOOK_RETENTION_DAYS`` go, with their steps, events,
  deliveries (failed ones too: until then they can be replayed), attempts, waits, approvals
  and the inbound hook dedup keys that point at them; signals sent before then go too;
- the bodies of events older than ``FLOWHOOK_DELIVERY_RETENTION_DAYS`` that no delivery
  still needs (none pending or failed) become ``null``, and their succeeded deliveries'
  attempts lose their response excerpts;
- on SQLite (incremental auto-vacuum) the pages this freed are given back to the file
  system, a few at a time;
- past ``FLOWHOOK_DISK_BUDGET_MB``, the oldest finished runs go ahead of their age, as many
  as it takes to get under 90 % of it (:meth:`RetentionService.keep_to_budget`), and the
  space is given back: on SQLite the free pages and a truncating WAL checkpoint, on
  PostgreSQL a ``VACUUM (ANALYZE)`` of the tables deleted from (their files keep their size;
  new rows reuse the space).

On SQLite the WAL is checkpointed by SQLite itself, inside the commit that takes it past
1,000 pages. A passive checkpoint on a thread after each batch was tried (2026-11-25) and
taken out: pruning a million runs, it made some batches' commits many times slower and
stalled the pass's event loop (figures: bench/README.md, "Figures moved from docstrings").

Everything goes in short transactions (at most :data:`BATCH` runs, :data:`VACUUM_STEP` pages),
with a pause after each as long as it took, so API writes waiting for the single SQLite writer
(or, on the inline driver, for the event loop) get their turn in between. On SQLite each
transaction aims to hold the writer for :data:`TARGET`: the next batch is sized by how long
the last one held it, so runs with many rows (a ``map`` over thousands of items) or a slow
disk make the batches smaller instead of blocking the API for longer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from flowhook.clock import Clock
from flowhook.service import disk
from flowhook.store import retention as store
from flowhook.store import space
from flowhook.store.db import Database

__all__ = [
    "RetentionService",
    "Pruned",
    "BATCH",
    "CLEAR_BATCH",
    "VACUUM_STEP",
    "TARGET",
    "next_size",
    "ROUNDS",
    "PRUNED_TABLES",
]

log = logging.getLogger("flowhook.retention")

BATCH = 200
"""Runs deleted per transaction (each with ~10 rows of history)."""

CLEAR_BATCH = 500
"""Events looked at per transaction when clearing delivered bodies."""

VACUUM_STEP = 1000
"""SQLite pages (4 KiB each by default) given back per transaction."""

MIN_PAUSE = 0.002
"""Seconds at least between two of retention's transactions."""

TARGET = 0.020
"""Seconds each of retention's transactions aims to hold the writer (see the module's
docstring): a batch of :data:`BATCH` ordinary runs stays under it on SQLite, so it is cut
only when its rows are many (runs with thousands of steps) or the disk is slow, and stays
within the API's bound for a wait behind one (bench/README.md, "Figures moved from
docstrings")."""


ROUNDS = 8
"""Rounds of deleting, giving back and measuring again a disk budget pass takes at most."""

PRUNED_TABLES = [
    "delivery_attempts", "deliveries", "events", "run_steps", "inbound_dedup", "waits",
    "approvals", "tasks", "runs",
]  # fmt: skip
"""The tables a run's deletion deletes from (``store.retention.prune_batch``)."""


def next_size(size: int, held: float, least: int, most: int) -> int:
    """The next batch's size after one of ``size`` held the writer ``held`` seconds: what
    would take :data:`TARGET` at that pace, growing at most twofold a step, kept within
    ``least`` and ``most``."""
    wanted = int(size * TARGET / max(held, 1e-4))
    return max(least, min(most, 2 * size, wanted))


@dataclass(frozen=True, slots=True)
class Pruned:
    runs: int = 0
    signals: int = 0
    events_cleared: int = 0
    """Events looked at for clearing (their bodies cleared unless a delivery still needs them)."""
    pages_freed: int = 0
    """SQLite pages given back to the file system."""
    over_budget: int = 0
    """Finished runs deleted ahead of their age to keep under ``FLOWHOOK_DISK_BUDGET_MB``."""


class RetentionService:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        days: float,
        delivery_days: float | None = None,
        budget_bytes: int | None = None,
    ) -> None:
        self._db = db
        self._budget = budget_bytes
        self._clock = clock
        self._days = days
        self._delivery_days = days if delivery_days is None else min(delivery_days, days)
        self._warned = False

    async def prune(self, days: float | None = None) -> int:
        """Prune what retention allows now (:meth:`prune_all`); the number of runs removed."""
        return (await self.prune_all(days)).runs

    async def prune_all(self, days: float | None = None) -> Pruned:
        """Everything retention allows now, in short transactions; ``days`` overrides
        ``FLOWHOOK_RETENTION_DAYS`` (and caps the delivery window)."""
        days = self._days if days is None else days
        now = self._clock.now()
        before = now - timedelta(days=days)
        runs = await self._batches(lambda c, n: store.prune_batch(c, before, n), BATCH)
        signals = await self._batches(lambda c, n: store.prune_signals(c, before, n), BATCH)
        cleared_before = now - timedelta(days=min(self._delivery_days, days))
        cleared = await self._batches(
            lambda c, n: store.clear_delivered(c, cleared_before, before, n), CLEAR_BATCH
        )
        freed = await self.give_back()
        over = await self.keep_to_budget()
        return Pruned(runs, signals, cleared, freed, over)

    async def keep_to_budget(self) -> int:
        """Past the disk budget: delete the oldest finished runs (with all their rows, as
        :meth:`prune_all` does) ahead of their age, give the space back and measure again,
        until the database is under :data:`~flowhook.service.disk.MARGIN` of the budget, no
        finished run is left or :data:`ROUNDS` rounds went; how many runs went. Runs still
        going are never deleted. Says at warning what it deleted and why, and when it could
        not get under the budget."""
        budget = self._budget
        if budget is None:
            return 0
        began = await self._usage()
        if began.database_bytes <= budget:
            return 0
        now = await self._give_space_back(0)  # a WAL checkpoint may be all it takes
        deleted, exhausted = 0, False
        for _ in range(ROUNDS):
            async with self._db.read() as conn:
                count = await store.run_count(conn)
            wanted = disk.to_delete(now.database_bytes, budget, count)
            if wanted == 0:
                exhausted = now.database_bytes > budget  # over, and no run in the database
                break
            done = await self._batches(store.prune_oldest, BATCH, limit=wanted)
            deleted += done
            now = await self._give_space_back(done)
            if done < wanted:  # no finished run is left
                exhausted = True
                break
        self._say(budget, began, now, deleted, exhausted)
        return deleted

    def _say(
        self, budget: int, began: space.Usage, now: space.Usage, deleted: int, exhausted: bool
    ) -> None:
        head = (
            f"disk budget {disk.megabytes(budget)}: database {disk.megabytes(began.database_bytes)}"
        )
        if deleted:
            log.warning(
                "%s; deleted the %s oldest finished runs (ahead of their retention age); "
                "now %s", head, f"{deleted:,}", disk.megabytes(now.database_bytes),
            )  # fmt: skip
        if now.database_bytes > budget:
            log.warning(
                "%s; still over it at %s: %s",
                head,
                disk.megabytes(now.database_bytes),
                "no finished run is left to delete (only runs still going)"
                if exhausted
                else f"after {ROUNDS} rounds of deleting (the next pass goes on)",
            )

    async def _usage(self) -> space.Usage:
        async with self._db.read() as conn:
            return await space.usage(conn)

    async def _give_space_back(self, deleted: int) -> space.Usage:
        """After deleting for the budget: SQLite's free pages and its WAL given back to the
        file system; PostgreSQL's tables vacuumed (space reusable, files as they were). The
        usage measured afterwards."""
        if deleted:
            await self.give_back()
            await space.vacuum_tables(self._db, PRUNED_TABLES)
        await space.checkpoint(self._db)
        return await self._usage()

    async def give_back(self) -> int:
        """SQLite with incremental auto-vacuum: give every free page back to the file
        system, :data:`VACUUM_STEP` at a time; how many went. Elsewhere nothing."""
        if not self._db.driver.shrinks_its_file:
            return 0
        async with self._db.read() as conn:
            before = await space.storage(conn)
        if before.auto_vacuum != "incremental":
            if before.free_bytes and not self._warned:
                self._warned = True
                log.warning(
                    "retention: %d MiB of the SQLite file are free pages, which this database "
                    "cannot give back (made before incremental auto-vacuum); run `flowhook "
                    "vacuum` once to convert it",
                    before.free_bytes // (1024 * 1024),
                )
            return 0
        if not before.free_bytes:
            return 0
        freed, left = 0, before.free_bytes // (before.page_size or 1)
        step = VACUUM_STEP
        while left:
            began = time.perf_counter()
            done = await space.free_pages(self._db, step)
            took = time.perf_counter() - began
            freed += max(0, left - done.left)
            if done.left >= left:  # nothing moved (another writer keeps adding free pages)
                break
            left = done.left
            # sized by how long it held the writer, as the batches are: a step that first
            # waited behind the API's writes was not itself slow
            step = next_size(step, done.held, VACUUM_STEP // 10, VACUUM_STEP)
            await asyncio.sleep(max(MIN_PAUSE, took))
        return freed

    async def _batches(self, step: store.Step, most: int, limit: int | None = None) -> int:
        """``step`` over and over until one handles fewer rows than it was given (or
        ``limit`` rows in all were handled); where there is one writer (SQLite) each batch
        sized by :func:`next_size`, the first an eighth of ``most`` (the rows of a run are
        not known before it is deleted)."""
        one_writer = self._db.driver.one_writer
        total, size = 0, max(1, most // 8) if one_writer else most
        while True:
            began = time.perf_counter()
            given = size if limit is None else min(size, limit - total)
            async with self._db.transaction() as conn:
                held = time.perf_counter()  # the writer is ours from here to the commit
                done = await step(conn, given)
            now = time.perf_counter()
            total += done
            if done < given or (limit is not None and total >= limit):
                return total
            if one_writer:  # elsewhere writers do not queue behind one another
                size = next_size(size, now - held, 1, most)
            await asyncio.sleep(max(MIN_PAUSE, now - began))
