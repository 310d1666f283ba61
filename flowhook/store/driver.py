"""The driver seam: what the store asks of a backend, and every place SQLite and PostgreSQL
differ (River's driver interface, DBOS's system-database subclasses).

The store's modules build their statements once, against SQLAlchemy Core, and run them
through the :class:`Driver` of the connection's database (:func:`driver_of`; a
:class:`~flowhook.store.db.Database` chooses its own once, ``db.driver``): many-row writes,
a statement built once run straight on the backend's own driver, and each backend quirk as a
named method or capability (a row lock, an advisory lock, a ``NOTIFY``, writes inside one
statement). :class:`~flowhook.store.sqlite_driver.SQLiteDriver` and
:class:`~flowhook.store.pg_driver.PostgresDriver` implement it; the store's tests, run on
both backends, are its conformance suite.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cache
from typing import Any, ClassVar, NamedTuple

from sqlalchemy import Column, Table, and_, bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement
from sqlalchemy.types import (
    BigInteger,
    Float,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    TypeEngine,
)

from flowhook.config import database_backend

__all__ = [
    "Driver",
    "Insert",
    "Attached",
    "Beside",
    "Pairs",
    "STORED_AS_GIVEN",
    "driver_of",
    "driver_named",
    "driver_for_url",
    "insert_statement",
    "update_statement",
    "bound",
    "last_per_key",
    "causes",
]

Pairs = Sequence[tuple[dict[str, Any], dict[str, Any]]]
"""Rows of an update by key: (the values to write, the key columns' values) each."""

STORED_AS_GIVEN: frozenset[type[TypeEngine[Any]]] = frozenset(
    {String, Text, Integer, SmallInteger, BigInteger, LargeBinary, Float}
)
"""Types whose values both drivers hand over and read back as SQLAlchemy's dialects do (no
processing). Exact classes: a subclass (``Enum`` is a ``String``) may process its values."""


class Insert(NamedTuple):
    """Rows to insert into ``table`` (all with the same keys) in the statement of a query
    (:meth:`Driver.insert_then_read`), with ``NOTIFY channel, notice`` unless ``channel`` is
    ``None``."""

    table: Table
    rows: Sequence[dict[str, Any]]
    channel: str | None = None
    notice: str = ""


class Attached(NamedTuple):
    """Rows inserted into ``table`` by a guarded update (:meth:`Driver.update_each`), those
    of the rows it applied only: a row goes in when its ``link`` column holds the first key of
    an updated row. ``update_on_conflict``: as :meth:`Driver.insert`'s."""

    table: Table
    rows: Sequence[dict[str, Any]]
    link: str
    update_on_conflict: tuple[str, ...] = ()


class Beside(NamedTuple):
    """A statement that a guarded update (:meth:`Driver.update_each`) runs inside its own
    statement where the backend has :attr:`Driver.compound_writes`, after the update: built
    once (its parameters named apart from the update's, none starting with ``a_v_`` or
    ``a_k_``), with this call's parameters. Its rows are not read. For writes that belong in
    the update's transaction whatever it applied."""

    statement: Any
    params: dict[str, Any]


class Driver(ABC):
    """One backend under the store. Stateless: one instance per backend serves every
    database of it."""

    name: ClassVar[str]
    """SQLAlchemy's dialect name (``sqlite``, ``postgresql``)."""
    label: ClassVar[str]
    """The backend's name for people (logs)."""
    one_writer: ClassVar[bool]
    """One write transaction at a time in the whole database (SQLite): rows need no locks
    of their own and no lock order, and writers queue behind one another, so long work is
    cut into batches that hold the writer briefly."""
    tells_other_processes: ClassVar[bool]
    """A ``NOTIFY`` sent in a transaction reaches every process's ``LISTEN`` at its commit
    (PostgreSQL). Without it only this process's wake-ups (and ``flowhook serve``'s peer
    link) carry the news."""
    compound_writes: ClassVar[bool]
    """One statement may write several tables and read (data-modifying ``WITH`` clauses,
    PostgreSQL): the store's hot paths are then one round trip each."""
    shrinks_its_file: ClassVar[bool]
    """The database is a file this process gives pruned space back to the file system from
    (SQLite with incremental auto-vacuum, :mod:`flowhook.store.space`); a server keeps its
    own free space."""

    @abstractmethod
    def engine_url(self, url: str) -> str:
        """The SQLAlchemy URL (its async driver) of a user's database URL."""

    @abstractmethod
    async def rows(
        self, conn: AsyncConnection, stmt: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Run ``stmt`` (built once, its values all named bind parameters; a list for an
        ``expanding`` one) on the backend's own driver, compiled once, and return its rows
        as tuples of the values SQLAlchemy's types give."""

    @abstractmethod
    async def insert(
        self,
        conn: AsyncConnection,
        table: Table,
        rows: Sequence[dict[str, Any]],
        *,
        update_on_conflict: tuple[str, ...] = (),
        channel: str | None = None,
        notice: str = "",
    ) -> None:
        """Insert ``rows`` (not empty, all with the same keys); with ``update_on_conflict``
        (the key columns), a row whose key exists replaces that row's other columns. With
        ``channel``: ``NOTIFY channel, notice`` at commit, where the backend tells other
        processes (in the insert's own statement there)."""

    @abstractmethod
    async def update(self, conn: AsyncConnection, table: Table, rows: Pairs) -> None:
        """``UPDATE table SET <values> WHERE <keys>`` for each pair of ``rows`` (not empty,
        every pair naming the same columns), unguarded."""

    @abstractmethod
    async def update_each(
        self,
        conn: AsyncConnection,
        table: Table,
        rows: Pairs,
        *,
        guard: str | None,
        ordered: bool,
        attached: Attached | None,
        beside: Sequence[Beside],
    ) -> list[bool]:
        """:meth:`update` with a guard, telling for each row whether the database applied
        it (see :func:`flowhook.store.bulk.update_each`)."""

    @abstractmethod
    async def insert_then_read(
        self, conn: AsyncConnection, written: Insert, query: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """``written``'s rows inserted (its ``NOTIFY`` sent at commit, where there is one),
        then ``query``'s rows (:meth:`rows`); in one statement with :attr:`compound_writes`.
        ``query`` must not look for the rows written: in one statement it reads the
        database as it was before the insert."""

    @abstractmethod
    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        """``NOTIFY channel`` at commit, where the backend tells other processes."""

    @abstractmethod
    async def lock(self, conn: AsyncConnection, name: str) -> None:
        """Serialise the transactions that take the lock ``name`` (a transaction-level
        advisory lock), where :attr:`one_writer` does not already."""

    @abstractmethod
    def locking(self, query: Any, *, skip_locked: bool = False) -> Any:
        """``query`` locking the rows it reads (``FOR UPDATE``, ``SKIP LOCKED`` with
        ``skip_locked``), where :attr:`one_writer` does not already."""

    @abstractmethod
    def one_of(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        """``column`` among the list bound as ``name``: one statement text whatever the
        list's length where the backend takes an array."""

    @abstractmethod
    def greatest(self, *values: Any) -> ColumnElement[Any]:
        """The greatest of ``values`` in SQL."""

    @abstractmethod
    def upsert(self, table: Table) -> Any:
        """The backend's ``INSERT`` of ``table``, which takes ``on_conflict_do_update``."""

    @abstractmethod
    def milliseconds_since(self, now: Any, column: Column[Any]) -> ColumnElement[Any]:
        """Whole milliseconds from the timestamp ``column`` to ``now`` (a datetime), never
        below 0, in SQL."""

    @abstractmethod
    async def prefer_nested_loops(self, conn: AsyncConnection) -> None:
        """No merge joins for the rest of the transaction, where the planner would choose
        them (see :func:`flowhook.store.retention.prune_batch`)."""

    @abstractmethod
    def is_duplicate(self, exc: BaseException) -> bool:
        """Whether the driver's error ``exc`` says a unique key refused a row."""


@cache
def _drivers() -> dict[str, Driver]:
    # imported here: each driver module imports this one
    from flowhook.store.pg_driver import PostgresDriver
    from flowhook.store.sqlite_driver import SQLiteDriver

    return {d.name: d for d in (SQLiteDriver(), PostgresDriver())}


def driver_named(name: str) -> Driver:
    """The driver of the backend ``name`` (``sqlite``, ``postgresql``)."""
    return _drivers()[name]


def driver_for_url(url: str) -> Driver:
    """The driver of the backend a database URL names."""
    return driver_named(database_backend(url))


def driver_of(conn: AsyncConnection) -> Driver:
    """The driver of the database ``conn`` belongs to."""
    return _drivers()[conn.dialect.name]


def causes(exc: BaseException, depth: int = 8) -> list[BaseException]:
    """``exc`` and what it wraps (a DBAPI error's ``orig``, each ``__cause__`` and
    ``__context__``), nearest first, at most ``depth`` links from ``exc``."""
    found: list[BaseException] = []
    level: list[BaseException] = [exc]
    for _ in range(depth):
        following: list[BaseException] = []
        for seen in level:
            if any(seen is f for f in found):
                continue
            found.append(seen)
            for link in (getattr(seen, "orig", None), seen.__cause__, seen.__context__):
                if isinstance(link, BaseException):
                    following.append(link)
        if not following:
            break
        level = following
    return found


def insert_statement(
    table: Table,
    columns: tuple[str, ...],
    conflict: tuple[str, ...],
    dialect: str,
    source: Any = None,
) -> Any:
    """``INSERT INTO table`` on the backend ``dialect`` (``… SELECT <source>`` when given)
    and, with ``conflict`` (the key columns), ``ON CONFLICT (conflict) DO UPDATE SET <the
    other columns>``."""
    stmt = driver_named(dialect).upsert(table)
    if source is not None:
        stmt = stmt.from_select(list(columns), source)
    if conflict:
        stmt = stmt.on_conflict_do_update(
            index_elements=list(conflict),
            set_={c: stmt.excluded[c] for c in columns if c not in conflict},
        )
    return stmt


def update_statement(
    table: Table, columns: tuple[str, ...], keys: tuple[str, ...], guard: str | None = None
) -> Any:
    """``UPDATE table SET <c = :v_c> WHERE <k = :w_k> [AND guard]``, one row's update."""
    stmt = (
        table.update()
        .where(and_(*(table.c[k] == bindparam(f"w_{k}") for k in keys)))
        .values({c: bindparam(f"v_{c}") for c in columns})
    )
    return stmt if guard is None else stmt.where(text(guard))


def bound(values: dict[str, Any], key: dict[str, Any]) -> dict[str, Any]:
    """One row's parameters for :func:`update_statement`."""
    return {**{f"v_{c}": v for c, v in values.items()}, **{f"w_{k}": v for k, v in key.items()}}


def last_per_key(rows: Sequence[dict[str, Any]], key: tuple[str, ...]) -> Sequence[dict[str, Any]]:
    """``rows`` with, of those that share a value of ``key``, only the last: what one row
    after another would have left, which one statement cannot do (PostgreSQL refuses an
    ``ON CONFLICT DO UPDATE`` that meets its own row twice)."""
    last = {tuple(row[k] for k in key): row for row in rows}
    return rows if len(last) == len(rows) else list(last.values())
