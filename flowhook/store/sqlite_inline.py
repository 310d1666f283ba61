"""SQLite run on the event loop's own thread: the SQLAlchemy dialect ``sqlite+flowhook_inline``.

aiosqlite runs every call (cursor, execute, fetch, close, commit) on a thread of its own and
hands the result back through the event loop: four round trips per statement, each waiting
for the loop's next turn. Under load that wait, not SQLite, was the cost: a group-commit
transaction of a few dozen statements stayed open for ~30 ms while SQLite itself needed well
under one. This module's connection has aiosqlite's public shape (coroutine methods) but runs
the ``sqlite3`` call at once, so a statement costs what SQLite costs (microseconds for the
indexed statements Flowhook issues; a commit's fsync ~0.2 ms here).

What it must never do is block the loop on a lock: another process (the engine process of
``flowhook serve``, which writes beside its API process all the time; a second ``flowhook
serve`` on the same file; the CLI) may hold the write lock. So the connection's busy timeout
is zero and a ``SQLITE_BUSY`` answer is retried after an asynchronous sleep, up to
``busy_timeout`` seconds in all, which is what SQLite's own busy handler would have done on a
thread, with waits kept short (:data:`BUSY_WAIT`). In WAL mode only
``BEGIN IMMEDIATE`` and a commit's checkpoint can meet such a lock; reads never wait for
writers.

The seam with SQLAlchemy is a registered dialect, :class:`SQLiteDialect_inline`: the aiosqlite
dialect (SQL, types, pool choice, URL options) with its own DBAPI ``connect`` and a subclass of
SQLAlchemy's aiosqlite adapter whose few methods that reached into aiosqlite's private
attributes are replaced. The rest of that adapter only awaits the public coroutine methods
below. Callers reach the ``sqlite3`` connection through SQLAlchemy's documented
``driver_connection`` and :attr:`InlineConnection.raw`. What this relies on inside SQLAlchemy
(pinned ``>=2.1,<2.2`` in pyproject.toml) is checked by ``tests/unit/test_sqlite_inline_seam.py``,
which fails with a message naming the change on an upgrade.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiosqlite
from sqlalchemy import URL, make_url
from sqlalchemy.connectors.asyncio import AsyncAdapt_dbapi_connection
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_dbapi,
    SQLiteDialect_aiosqlite,
)

if TYPE_CHECKING:
    from sqlalchemy.connectors.asyncio import AsyncIODBAPIConnection

__all__ = [
    "DRIVER",
    "InlineConnection",
    "SQLiteDialect_inline",
    "engine_url",
    "is_busy",
    "wait_for_lock",
    "open_connection",
]

DRIVER = "flowhook_inline"
"""The dialect's driver name: URLs ``sqlite+flowhook_inline:///path``."""

T = TypeVar("T")

_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)

BUSY_WAIT = 0.001
"""Seconds between tries of a statement that met another process's lock. ``flowhook serve``
on SQLite is two processes that both write (the API accepts runs, the engine records their
progress), each holding the lock for a millisecond or two, and a try costs a few
microseconds. So the waiter tries again every millisecond, the event loop's timer resolution
(libuv's; shorter waits would spin), and does not back off: with waits that grew from 1 to
4 ms, the API process of ``serve`` spent a third of an accept load asleep past the engine's
commits (bench/README.md, "Accepting in two round trips on PostgreSQL, lock waits of one
millisecond on SQLite"). Backed off to tens of milliseconds, a waiter lost the lock to the
other side over and over. A lock held long (``flowhook vacuum``) costs a try a
millisecond."""


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says another connection holds the lock (SQLITE_BUSY or _LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return bool((code & 0xFF) in _BUSY)
    text = str(exc)
    return "database is locked" in text or "database table is locked" in text


class LockWaits:
    """How often this process's statements met another process's lock, and how long they
    slept in all (``flowhook serve`` logs it when it stops)."""

    __slots__ = ("count", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0


lock_waits = LockWaits()


async def wait_for_lock(deadline: float) -> None:
    """One wait of a statement that met another process's write lock: :data:`BUSY_WAIT`, or
    less to end by ``deadline`` (``time.monotonic()``), counted in :data:`lock_waits`."""
    pause = min(BUSY_WAIT, deadline - time.monotonic())
    lock_waits.count += 1
    lock_waits.seconds += pause
    await asyncio.sleep(pause)


class InlineCursor:
    """The part of ``aiosqlite.Cursor`` that SQLAlchemy's adapter uses."""

    __slots__ = ("_conn", "_cursor")

    def __init__(self, conn: InlineConnection) -> None:
        self._conn = conn
        self._cursor = conn.raw.cursor()

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


class InlineConnection:
    """A ``sqlite3`` connection with the coroutine methods of ``aiosqlite.Connection`` that
    SQLAlchemy's async adapter awaits; each runs its call at once."""

    __slots__ = ("_busy_timeout", "closed", "raw")

    def __init__(self, conn: sqlite3.Connection, busy_timeout: float) -> None:
        self.raw = conn
        """The ``sqlite3`` connection (bulk writes hand it their executemany)."""
        self.closed = False
        self._busy_timeout = busy_timeout

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        deadline: float | None = None
        while True:
            try:
                return function(*args)
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._busy_timeout
                if now >= deadline:
                    raise
                await wait_for_lock(deadline)

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` (a call on :attr:`raw`), tried again after an asynchronous
        wait while another process holds the lock, as every statement is."""
        return await self._call(function, *args)

    @property
    def isolation_level(self) -> str | None:
        return self.raw.isolation_level

    @isolation_level.setter
    def isolation_level(self, value: Any) -> None:
        self.raw.isolation_level = value

    def cursor(self) -> InlineCursor:
        return InlineCursor(self)

    async def commit(self) -> None:
        await self._call(self.raw.commit)

    async def rollback(self) -> None:
        self.raw.rollback()

    async def create_function(self, *args: Any, **kwargs: Any) -> None:
        self.raw.create_function(*args, **kwargs)

    async def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Close (also SQLAlchemy's forced close, its terminate); a second call does nothing."""
        if not self.closed:
            self.closed = True
            self.raw.close()


def open_connection(
    database: str, *, busy_timeout: float = 10.0, **options: Any
) -> InlineConnection:
    """Open ``database`` on this thread, with the URL's ``sqlite3.connect`` options (``uri``,
    …) but our own lock handling: a URL's ``timeout`` is the busy timeout."""
    if "timeout" in options:
        busy_timeout = float(options.pop("timeout"))
    # The driver does not manage transactions (isolation_level=None): Database emits
    # BEGIN IMMEDIATE / BEGIN itself. timeout=0: lock waits are retried above.
    conn = sqlite3.connect(
        database,
        **{**options, "isolation_level": None, "check_same_thread": False, "timeout": 0},
    )
    return InlineConnection(conn, busy_timeout)


class _Adapter(AsyncAdapt_aiosqlite_connection):
    """SQLAlchemy's aiosqlite adapter, minus its reaches into aiosqlite's privates: it set
    ``isolation_level`` through aiosqlite's thread queue (``_tx``, ``_conn``) and tells a
    closed connection by ``_connection``. Everything else it does awaits the public methods
    of :class:`InlineConnection` (``stop`` included, its forced close)."""

    __slots__ = ()

    @property
    def _inline(self) -> InlineConnection:
        return cast(InlineConnection, self._connection)

    @property
    def isolation_level(self) -> str | None:
        return self._inline.isolation_level

    @isolation_level.setter
    def isolation_level(self, value: str | None) -> None:
        try:
            self._inline.isolation_level = value  # this thread is the connection's own
        except Exception as error:  # noqa: BLE001 - translated as the adapter does
            self._handle_exception(error)

    def rollback(self) -> None:
        if not self._inline.closed:
            AsyncAdapt_dbapi_connection.rollback(self)

    def commit(self) -> None:
        if not self._inline.closed:
            AsyncAdapt_dbapi_connection.commit(self)


class _DBAPI(AsyncAdapt_aiosqlite_dbapi):
    """aiosqlite's DBAPI module (``sqlite3``'s errors and constants) with our ``connect``."""

    def __init__(self) -> None:
        super().__init__(aiosqlite, sqlite3)
        self.has_stop = True  # InlineConnection.stop, whatever aiosqlite's version has

    def connect(self, *args: Any, **kwargs: Any) -> _Adapter:
        return _Adapter(self, cast("AsyncIODBAPIConnection", open_connection(*args, **kwargs)))


class SQLiteDialect_inline(SQLiteDialect_aiosqlite):
    """``sqlite+flowhook_inline://``: the aiosqlite dialect over :class:`InlineConnection`.
    ``connect_args={"busy_timeout": s}`` sets the lock wait (a URL's ``?timeout=`` wins)."""

    driver = DRIVER
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> _DBAPI:
        return _DBAPI()


registry.register(f"sqlite.{DRIVER}", __name__, "SQLiteDialect_inline")


def engine_url(url: str | URL) -> URL:
    """``url`` (any ``sqlite[+driver]://`` URL) on this module's dialect."""
    return make_url(url).set(drivername=f"sqlite+{DRIVER}")
