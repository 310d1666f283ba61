"""Retention, by kind:

- finished runs older than ``FLOWHOOK_RETENTION_DAYS`` go, with their steps, events,
  deliveries (failed ones too: until then they can be replayed), attempts, waits, approvals
  and the inbound hook dedup keys that point at them; signals sent before then go too;
- the bodies of events older than ``FLOWHOOK_DELIVERY_RETENTION_DAYS`` that no delivery
  still needs (none pending or failed) become ``null``, and their succeeded deliveries'
  attempts lose their response excerpts;
- on SQLite (incremental auto-vacuum) the pages this freed are given back to the file
  system, a few at a time.

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


class RetentionService:
    def __init__(
        self, db: Database, clock: Clock, days: float, delivery_days: float | None = None
    ) -> None:
        self._db = db
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
        return Pruned(runs, signals, cleared, freed)

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

    async def _batches(self, step: store.Step, most: int) -> int:
        """``step`` over and over until one handles fewer rows than it was given; where
        there is one writer (SQLite) each batch sized by :func:`next_size`, the first an
        eighth of ``most`` (the rows of a run are not known before it is deleted)."""
        one_writer = self._db.driver.one_writer
        total, size = 0, max(1, most // 8) if one_writer else most
        while True:
            began = time.perf_counter()
            async with self._db.transaction() as conn:
                held = time.perf_counter()  # the writer is ours from here to the commit
                done = await step(conn, size)
            now = time.perf_counter()
            total += done
            if done < size:
                return total
            if one_writer:  # elsewhere writers do not queue behind one another
                size = next_size(size, now - held, 1, most)
            await asyncio.sleep(max(MIN_PAUSE, now - began))
