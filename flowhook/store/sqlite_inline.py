"""SQLite run on the event loop's own thread, under SQLAlchemy's aiosqlite dialect.

aiosqlite runs every call (cursor, execute, fetch, close, commit) on a thread of its own and
hands the result back through the event loop: four round trips per statement, each waiting
for the loop's next turn. Under load that wait, not SQLite, was the cost: a group-commit
transaction of a few dozen statements stayed open for ~30 ms while SQLite itself needed well
under one. This module gives SQLAlchemy an aiosqlite-shaped connection whose coroutines run
the ``sqlite3`` call at once, so a statement costs what SQLite costs (microseconds for the
indexed statements Flowhook issues; a commit's fsync ~0.2 ms here).

What it must never do is block the loop on a lock: another process (a second ``flowhook
serve`` on the same file, the CLI) may hold the write lock. So the connection's busy timeout
is zero and a ``SQLITE_BUSY`` answer is retried after an asynchronous sleep, up to
``busy_timeout`` seconds in all, which is what SQLite's own busy handler would have done on a
thread. In WAL mode only ``BEGIN IMMEDIATE`` and a commit's checkpoint can meet such a lock;
reads never wait for writers.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

__all__ = ["InlineConnection", "connect"]

T = TypeVar("T")

_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool((code & 0xFF) in _BUSY)
    text = str(exc)
    return "database is locked" in text or "database table is locked" in text


class InlineCursor:
    """The part of ``aiosqlite.Cursor`` that SQLAlchemy's adapter uses."""

    __slots__ = ("_conn", "_cursor")

    def __init__(self, conn: InlineConnection) -> None:
        self._conn = conn
        self._cursor = conn._conn.cursor()

    async def __aenter__(self) -> InlineCursor:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self._cursor.close()

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    @property
    def arraysize(self) -> int:
        return self._cursor.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cursor.arraysize = value

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> InlineCursor:
        await self._conn._call(self._cursor.execute, sql, () if parameters is None else parameters)
        return self

    async def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> InlineCursor:
        # Not retried: outside a transaction each row commits alone, so a retry after
        # SQLITE_BUSY would write the first rows twice. (Flowhook's writes run inside
        # BEGIN IMMEDIATE, where no lock is met after the BEGIN.)
        self._cursor.executemany(sql, seq)
        return self

    async def fetchone(self) -> Any:
        return self._cursor.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cursor.fetchmany(self._cursor.arraysize if size is None else size)

    async def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    async def close(self) -> None:
        self._cursor.close()


class _InlineQueue:
    """SQLAlchemy's adapter sets ``isolation_level`` by queueing a call on aiosqlite's thread
    queue; here the call runs at once."""

    def put_nowait(self, item: tuple[asyncio.Future[Any] | None, Callable[[], Any]]) -> None:
        future, function = item
        try:
            result = function()
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller
            if future is not None:
                future.set_exception(exc)
            return
        if future is not None:
            future.set_result(result)


class InlineConnection:
    """The part of ``aiosqlite.Connection`` that SQLAlchemy's adapter uses."""

    def __init__(self, conn: sqlite3.Connection, busy_timeout: float) -> None:
        self._conn = conn
        self._connection: sqlite3.Connection | None = conn
        """Checked by the adapter's commit and rollback (aiosqlite's name for it)."""
        self._tx = _InlineQueue()
        self._busy_timeout = busy_timeout

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        deadline: float | None = None
        delay = 0.0005
        while True:
            try:
                return function(*args)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._busy_timeout
                if now >= deadline:
                    raise
                await asyncio.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.05)

    @property
    def isolation_level(self) -> str | None:
        return self._conn.isolation_level

    @isolation_level.setter
    def isolation_level(self, value: Any) -> None:
        self._conn.isolation_level = value

    def cursor(self) -> InlineCursor:
        return InlineCursor(self)

    async def commit(self) -> None:
        await self._call(self._conn.commit)

    async def rollback(self) -> None:
        self._conn.rollback()

    async def create_function(self, *args: Any, **kwargs: Any) -> None:
        self._conn.create_function(*args, **kwargs)

    async def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Close (also SQLAlchemy's forced close, its terminate); a second call does nothing."""
        if self._connection is not None:
            self._connection = None
            self._conn.close()


def connect(database: str, *, busy_timeout: float = 10.0, **options: Any) -> Callable[[], Any]:
    """An ``async_creator`` for ``create_async_engine``: opens ``database`` on this thread,
    with the URL's ``sqlite3.connect`` options (``uri``, …) but our own lock handling."""
    if "timeout" in options:
        busy_timeout = float(options.pop("timeout"))

    async def creator() -> InlineConnection:
        # The driver does not manage transactions (isolation_level=None): Database emits
        # BEGIN IMMEDIATE / BEGIN itself. timeout=0: lock waits are retried above.
        conn = sqlite3.connect(
            database,
            **{**options, "isolation_level": None, "check_same_thread": False, "timeout": 0},
        )
        return InlineConnection(conn, busy_timeout)

    return creator
