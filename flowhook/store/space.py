"""What the database occupies on disk, and giving pruned space back.

SQLite keeps the pages of deleted rows in the file (its free list) unless the database uses
auto-vacuum. Flowhook makes new SQLite databases with ``auto_vacuum=INCREMENTAL``
(``store.db``): nothing moves by itself, and :func:`free_pages` hands a given number of free
pages back to the file system per call, so pruning can give back space in steps short enough
not to hold the single writer (or, on the inline driver, the event loop) for long. A database
made before that is converted once by :func:`convert_to_incremental` (``flowhook vacuum``: a
full ``VACUUM``, which rewrites the file and blocks writers meanwhile).

PostgreSQL gives space back to its own free space map (autovacuum), not to the file system;
:func:`storage` reports ``pg_database_size``, with the free bytes unknown (``None``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import sqlite_inline
from flowhook.store.db import Database

__all__ = [
    "Storage",
    "storage",
    "free_pages",
    "Freed",
    "auto_vacuum_mode",
    "convert_to_incremental",
    "INCREMENTAL",
    "Usage",
    "usage",
    "checkpoint",
    "vacuum_tables",
]

INCREMENTAL = 2
"""``PRAGMA auto_vacuum``'s answer for incremental auto-vacuum (0: none, 1: full)."""


@dataclass(frozen=True, slots=True)
class Storage:
    """The database's size: on SQLite the main file's pages (``page_count × page_size``) and
    the free ones among them (``freelist_count × page_size``), which pruning left and
    :func:`free_pages` gives back; on PostgreSQL ``pg_database_size`` and ``None``."""

    size_bytes: int
    free_bytes: int | None
    page_size: int | None = None
    auto_vacuum: str | None = None
    """SQLite: ``incremental`` (pruning gives disk back), ``none`` or ``full``."""


_MODES = {0: "none", 1: "full", 2: "incremental"}


async def storage(conn: AsyncConnection) -> Storage:
    if conn.dialect.name == "sqlite":
        page_size = int(await conn.scalar(text("PRAGMA page_size")) or 0)
        pages = int(await conn.scalar(text("PRAGMA page_count")) or 0)
        free = int(await conn.scalar(text("PRAGMA freelist_count")) or 0)
        mode = int(await conn.scalar(text("PRAGMA auto_vacuum")) or 0)
        return Storage(pages * page_size, free * page_size, page_size, _MODES.get(mode, "none"))
    size = int(await conn.scalar(text("SELECT pg_database_size(current_database())")) or 0)
    return Storage(size, None)


async def auto_vacuum_mode(conn: AsyncConnection) -> int:
    """SQLite's ``PRAGMA auto_vacuum`` (0 none, 1 full, 2 incremental); PostgreSQL: -1."""
    if conn.dialect.name != "sqlite":
        return -1
    return int(await conn.scalar(text("PRAGMA auto_vacuum")) or 0)


@dataclass(frozen=True, slots=True)
class Freed:
    """What one :func:`free_pages` step left, and how long it held the writer."""

    left: int
    """Free pages still in the file."""
    held: float = 0.0
    """Seconds from the write lock taken to the commit: its wait for the lock (behind the
    API's writes, or another process's) is not counted, so a step is sized by its own cost."""


async def free_pages(db: Database, pages: int, *, busy_timeout: float = 10.0) -> Freed:
    """SQLite with incremental auto-vacuum: give up to ``pages`` free pages back to the file
    system in one write transaction of its own (the file is truncated at its commit). It
    moves pages from the end of the file into free slots, so its cost grows with ``pages``,
    not with the database (~10 ms per 1,000 here). Elsewhere, or on a database without
    incremental auto-vacuum: ``Freed(0)``, nothing done."""
    if not db.is_sqlite:
        return Freed(0)
    async with db.writer.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection.raw  # type: ignore[union-attr]
        if raw.execute("PRAGMA auto_vacuum").fetchone()[0] != INCREMENTAL:
            return Freed(0)
        # The pragma frees one page per step of its statement, and the sqlite3 module steps
        # a statement without result columns once: a script steps it to the end. A script
        # commits what is pending first, so it carries its own transaction; the writer
        # connection is ours meanwhile (no SQLAlchemy transaction is open on it).
        script = f"BEGIN IMMEDIATE; PRAGMA incremental_vacuum({max(1, int(pages))}); COMMIT;"
        deadline = time.monotonic() + busy_timeout
        while True:
            began = time.perf_counter()
            try:
                raw.executescript(script)  # a busy lock raises at BEGIN IMMEDIATE, at once
                held = time.perf_counter() - began
                break
            except sqlite3.OperationalError as exc:
                if raw.in_transaction:
                    raw.execute("ROLLBACK")
                if not sqlite_inline.is_busy(exc) or time.monotonic() >= deadline:
                    raise
                # another process holds the write lock: wait as every statement does, not
                # backing off (this holds the process's one writer connection meanwhile)
                await sqlite_inline.wait_for_lock(deadline)
        return Freed(int(raw.execute("PRAGMA freelist_count").fetchone()[0]), held)


async def convert_to_incremental(db: Database) -> tuple[bool, float]:
    """SQLite: make the database incremental auto-vacuum if it is not yet (``PRAGMA
    auto_vacuum=INCREMENTAL`` then a full ``VACUUM``, which rewrites the file; writers wait
    meanwhile, readers do not) and return ``(converted, seconds)``; an incremental one only
    gives its free pages back and truncates the WAL. PostgreSQL: ``VACUUM (ANALYZE)`` of the
    database (space becomes reusable; the files do not shrink)."""
    began = time.perf_counter()
    async with db.writer.connect() as conn:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        if not db.is_sqlite:
            # VACUUM cannot run in a transaction: asyncpg's connection runs it as it is.
            await driver.execute("VACUUM (ANALYZE)")  # type: ignore[union-attr]
            return False, time.perf_counter() - began
        sqlite = driver.raw  # type: ignore[union-attr]
        # Wait for a running server's write transactions rather than fail (a command line,
        # not the event loop of a server: blocking here is what the operator asked for).
        sqlite.execute("PRAGMA busy_timeout=60000")
        mode = sqlite.execute("PRAGMA auto_vacuum").fetchone()[0]
        converted = mode != INCREMENTAL
        if converted:
            sqlite.execute("PRAGMA auto_vacuum=INCREMENTAL")
            sqlite.execute("VACUUM")
        else:
            sqlite.execute("PRAGMA incremental_vacuum").fetchall()
        sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        sqlite.execute("PRAGMA busy_timeout=0")
    return converted, time.perf_counter() - began


@dataclass(frozen=True, slots=True)
class Usage:
    """What the database takes, as the disk budget counts it (``service/disk.py``)."""

    database_bytes: int
    """The bytes that count against ``FLOWHOOK_DISK_BUDGET_MB``: on SQLite the main file and
    its WAL, less the free pages in the file it cannot give back (a database made before
    incremental auto-vacuum); on PostgreSQL ``pg_database_size`` less the space vacuum left
    free in the tables for new rows (estimated: it stays in the files)."""
    disk_bytes: int
    """The files: SQLite's main file and WAL; PostgreSQL's ``pg_database_size``."""
    wal_bytes: int = 0
    """SQLite: the ``-wal`` file (0 elsewhere)."""
    free_bytes: int = 0
    """Space in the files that new rows reuse: SQLite's free pages, PostgreSQL's estimate."""


# Free space in the tables of this schema, estimated from what (auto)vacuum and analyze
# recorded: a heap's pages less its live rows (``reltuples`` at the average width of their
# columns, ``pg_stats``, plus the tuple header and line pointer), its indexes in the same
# proportion (deleting the oldest rows empties whole index pages, which are reused, not
# returned), and a TOAST table's pages less its live chunks (at most 2,032 bytes each with
# their header). A table never analyzed (``reltuples`` -1) counts as full.
_PG_FREE = text(
    """
    WITH widths AS (
        SELECT tablename, sum(avg_width) AS width FROM pg_stats
        WHERE schemaname = current_schema() GROUP BY tablename
    ), heaps AS (
        SELECT c.oid, c.reltoastrelid,
            c.relpages::float8 * current_setting('block_size')::float8 AS bytes,
            CASE WHEN c.reltuples < 0 THEN NULL
                ELSE c.reltuples::float8 * (28 + coalesce(w.width, 0)) END AS live
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
        LEFT JOIN widths w ON w.tablename = c.relname
        WHERE c.relkind = 'r'
    )
    SELECT coalesce(sum(
        CASE WHEN h.live IS NULL OR h.bytes = 0 THEN 0 ELSE
            greatest(0::float8, h.bytes - h.live) * (1 + pg_indexes_size(h.oid) / h.bytes) END
        + CASE WHEN t.oid IS NULL OR t.reltuples < 0 THEN 0 ELSE greatest(0::float8,
            t.relpages::float8 * current_setting('block_size')::float8
            - t.reltuples::float8 * 2032) END
    ), 0)
    FROM heaps h LEFT JOIN pg_class t ON t.oid = h.reltoastrelid
    """
)


async def usage(conn: AsyncConnection) -> Usage:
    """The database's :class:`Usage` now (cheap: pragmas and a file's size on SQLite, the
    catalogs on PostgreSQL)."""
    if conn.dialect.name == "sqlite":
        page_size = int(await conn.scalar(text("PRAGMA page_size")) or 0)
        pages = int(await conn.scalar(text("PRAGMA page_count")) or 0)
        free = int(await conn.scalar(text("PRAGMA freelist_count")) or 0) * page_size
        mode = int(await conn.scalar(text("PRAGMA auto_vacuum")) or 0)
        main = next(
            (r[2] for r in (await conn.execute(text("PRAGMA database_list"))) if r[1] == "main"),
            "",
        )
        wal = 0
        if main:
            try:
                wal = os.stat(f"{main}-wal").st_size
            except FileNotFoundError:
                wal = 0
        size = pages * page_size + wal
        # free pages an incremental database gives back at the next prune are as good as gone
        kept = 0 if mode == INCREMENTAL else free
        return Usage(size - kept, size, wal, free)
    size = int(await conn.scalar(text("SELECT pg_database_size(current_database())")) or 0)
    reusable = min(size, int(await conn.scalar(_PG_FREE) or 0))
    return Usage(size - reusable, size, 0, reusable)


async def checkpoint(db: Database) -> tuple[int, int] | None:
    """SQLite: checkpoint the WAL and truncate it to nothing (``wal_checkpoint(TRUNCATE)``),
    without waiting: a reader still on an old snapshot makes it stop short (it tries again
    next time). Returns ``(busy, pages left in the WAL)``; PostgreSQL: ``None``."""
    if not db.is_sqlite:
        return None
    async with db.writer.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection.raw  # type: ignore[union-attr]
        try:
            busy, log, done = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.OperationalError as exc:  # another process writing: next time
            if not sqlite_inline.is_busy(exc):
                raise
            return 1, -1
    return int(busy), max(0, int(log) - int(done))


async def vacuum_tables(db: Database, names: list[str]) -> None:
    """PostgreSQL: ``VACUUM (ANALYZE)`` of these tables, outside a transaction: the space of
    deleted rows becomes free for new ones (the files keep their size) and the statistics
    :func:`usage` estimates that space from are brought up to date. SQLite: nothing."""
    if db.is_sqlite or not names:
        return
    async with db.writer.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        quoted = ", ".join(f'"{n}"' for n in names)
        await driver.execute(f"VACUUM (ANALYZE) {quoted}")  # type: ignore[union-attr]
