"""The SQLite driver: the store's statements straight on ``sqlite3``, under the inline
dialect's connection (:mod:`flowhook.store.sqlite_inline`) and in its transaction.

Through SQLAlchemy's executemany each row of a many-row write paid a type processor per
value in Python, a large share of the engine's time under load (bench/README.md, "Figures
moved from docstrings"). :meth:`SQLiteDriver.insert` and :meth:`~SQLiteDriver.update` hand the rows
to ``sqlite3``'s executemany instead, converted once per column to exactly what SQLAlchemy
would have stored (``tests/integration/test_bulk_insert.py`` compares the two byte for
byte); :func:`run_raw` runs any other statement built once (the claims, the due-time
probes) compiled for SQLite once, its parameters converted as SQLAlchemy would. SQLite has
one writer: nothing here locks rows or sends a ``NOTIFY``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

import orjson
import sqlalchemy.exc as sa_exc
from sqlalchemy import BigInteger, Column, Table, bindparam, func, literal_column
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement
from sqlalchemy.types import JSON, Boolean

from flowhook.ids import pack_id, unpack_id
from flowhook.store.driver import (
    STORED_AS_GIVEN,
    Attached,
    Beside,
    Driver,
    Insert,
    Pairs,
    bound,
    causes,
    insert_statement,
    update_statement,
)
from flowhook.store.sqlite_inline import InlineConnection
from flowhook.store.types import IdType, UTCDateTime, stored_datetime, to_micros

__all__ = [
    "SQLiteDriver",
    "inline_sqlite",
    "raw_sqlite",
    "run_raw",
    "stored_datetime",
]

Convert = Callable[[Any], Any]

_UNIQUE = (
    getattr(sqlite3, "SQLITE_CONSTRAINT_UNIQUE", 2067),
    getattr(sqlite3, "SQLITE_CONSTRAINT_PRIMARYKEY", 1555),
)
"""The extended result codes of a row a unique key (or the primary key) refused."""


def inline_sqlite(conn: AsyncConnection) -> InlineConnection | None:
    """The inline driver's connection under ``conn`` (in its transaction), or ``None`` when
    the store is not SQLite on the inline driver."""
    if conn.dialect.name != "sqlite":
        return None
    driver = conn.sync_connection.connection.driver_connection if conn.sync_connection else None
    return driver if isinstance(driver, InlineConnection) else None


def raw_sqlite(conn: AsyncConnection) -> sqlite3.Connection | None:
    """The ``sqlite3`` connection under ``conn`` (in its transaction), or ``None`` when the
    store is not SQLite on the inline driver."""
    inline = inline_sqlite(conn)
    return None if inline is None else inline.raw


def _sqlite_datetime(value: datetime | None) -> int | None:
    # UTCDateTime's SQLite storage: integer microseconds since the Unix epoch.
    return None if value is None else to_micros(value)


def _packed(value: str | None) -> bytes | None:
    return None if value is None else pack_id(value)  # IdType's stored form


def _sqlite_json(value: Any) -> str:
    return orjson.dumps(value).decode()  # None → 'null', as SQLAlchemy's JSON type stores it


def _sqlite_json_or_null(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()  # OptionalJSON: NULL


def _same(value: Any) -> Any:
    return value


def _sqlite_bool(value: Any) -> Any:
    return None if value is None else int(bool(value))  # SQLAlchemy's SQLite Boolean: 1 or 0


def _converter(column: Column[Any]) -> Convert:
    """How a value of ``column`` is handed to ``sqlite3``: exactly what SQLAlchemy would
    store. A type with no known conversion fails the plan (and so the write) instead of
    passing values through that SQLAlchemy would have stored differently."""
    type_ = column.type
    if type(type_) is UTCDateTime:
        return _sqlite_datetime
    if type(type_) is IdType:
        return _packed
    if type(type_) is JSON:
        return _sqlite_json_or_null if type_.none_as_null else _sqlite_json
    if type(type_) in STORED_AS_GIVEN:
        return _same
    if type(type_) is Boolean:
        return _sqlite_bool
    raise TypeError(
        f"bulk: no SQLite conversion known for {column.table.name}.{column.name} ({type_!r});"
        " add one to flowhook/store/sqlite_driver.py and the table to"
        " tests/integration/test_bulk_insert.py"
    )


@lru_cache(maxsize=64)
def _plan(
    table: Table, columns: tuple[str, ...], conflict: tuple[str, ...]
) -> tuple[str, list[tuple[str, Convert]]]:
    """The SQL for these columns, compiled once, and each parameter's column and converter
    in the order the SQL binds them."""
    stmt = insert_statement(table, columns, conflict, "sqlite").values({c: None for c in columns})
    compiled = stmt.compile(dialect=sqlite.dialect())
    order = list(compiled.positiontup or ())
    if sorted(order) != sorted(columns):  # pragma: no cover - each column is bound once
        raise RuntimeError(f"unexpected parameters for {table.name}: {order}")
    return str(compiled), [(name, _converter(table.c[name])) for name in order]


@lru_cache(maxsize=64)
def _update_plan(
    table: Table, columns: tuple[str, ...], keys: tuple[str, ...], guard: str | None = None
) -> tuple[str, list[tuple[int, str, Convert]]]:
    """SQL, and per parameter: 0 for a value or 1 for a key, its column, its converter."""
    compiled = update_statement(table, columns, keys, guard).compile(dialect=sqlite.dialect())
    plan = []
    for name in compiled.positiontup or ():
        side, column = (0, name[2:]) if name.startswith("v_") else (1, name[2:])
        plan.append((side, column, _converter(table.c[column])))
    return str(compiled), plan


def _refused(sql: str, exc: sqlite3.Error) -> sa_exc.StatementError:
    """``exc`` as SQLAlchemy would raise it (``IntegrityError``, …)."""
    return sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error)


@lru_cache(maxsize=128)
def _raw_plan(
    stmt: Any, sizes: tuple[tuple[str, int], ...]
) -> tuple[str, tuple[tuple[str, Convert], ...], dict[str, Any], tuple[int, ...]]:
    """``stmt`` compiled for SQLite (once), each expanding parameter of ``sizes`` written out
    as that many placeholders, the parameter names in the order the SQL binds them with how
    each value is converted, the values SQLAlchemy bound itself (a literal such as
    ``attempts + 1``'s one), and the positions of the ids among the columns read."""
    compiled = stmt.compile(dialect=sqlite.dialect())
    own = {k: v for k, v in compiled.params.items() if v is not None}
    sql = str(compiled)
    order: list[tuple[str, Convert]] = []
    size = dict(sizes)
    for name in compiled.positiontup or ():
        if name in size:
            if size[name] < 1:
                raise ValueError(f"run_raw: empty list for {name!r}")
            sql = sql.replace(f"__[POSTCOMPILE_{name}]", ", ".join("?" * size[name]), 1)
        bound_type = compiled.binds[name].type
        order.append((name, _packed if isinstance(bound_type, IdType) else _raw_value))
    if "__[POSTCOMPILE_" in sql:  # pragma: no cover - a list parameter without a list
        raise ValueError(f"run_raw: a list parameter was given no list: {sql}")
    read = tuple(i for i, c in enumerate(stmt.exported_columns) if isinstance(c.type, IdType))
    return sql, tuple(order), own, read


def _unpacked(row: tuple[Any, ...], ids: tuple[int, ...]) -> tuple[Any, ...]:
    values = list(row)
    for i in ids:
        if values[i] is not None:
            values[i] = unpack_id(values[i])
    return tuple(values)


def _raw_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return _sqlite_datetime(value)
    if isinstance(value, bool):
        return int(value)
    return value


async def run_raw(inline: InlineConnection, stmt: Any, params: dict[str, Any]) -> list[Any]:
    """Execute ``stmt`` (a statement built once, its values all named bind parameters; a
    list for an ``expanding`` one) on the connection of :func:`inline_sqlite` (another
    process's lock waited for as every statement's is: a read outside a write transaction
    may meet one) and return its rows as tuples of stored values (a datetime as SQLite holds
    it: integer microseconds, see :func:`stored_datetime`). Parameters are converted as the
    store's types bind them on SQLite (datetimes integer microseconds since the epoch,
    booleans 1/0, ids packed); of the columns read only ids are converted (unpacked)."""
    sizes = tuple(
        (name, len(value)) for name, value in params.items() if isinstance(value, list | tuple)
    )
    sql, order, own, ids = _raw_plan(stmt, sizes)
    values: list[Any] = []
    for name, convert in order:
        value = params[name] if name in params else own[name]
        if isinstance(value, list | tuple):
            values.extend(convert(v) for v in value)
        else:
            values.append(convert(value))
    try:
        cursor = await inline.call(inline.raw.execute, sql, values)
        rows = cursor.fetchall()
    except sqlite3.Error as exc:
        raise _refused(sql, exc) from exc
    return [_unpacked(row, ids) for row in rows] if ids else rows


@lru_cache(maxsize=128)
def _readers(stmt: Any, dialect: Any) -> tuple[tuple[int, Convert], ...]:
    """Per column ``stmt`` reads (ids aside: :func:`run_raw` unpacks them), SQLAlchemy's own
    result processing on ``dialect`` where it has any: the values its execution would give."""
    found = []
    for i, column in enumerate(stmt.exported_columns):
        if isinstance(column.type, IdType):
            continue
        read = column.type.dialect_impl(dialect).result_processor(dialect, None)
        if read is not None:
            found.append((i, read))
    return tuple(found)


class SQLiteDriver(Driver):
    name: ClassVar[str] = "sqlite"
    label: ClassVar[str] = "SQLite"
    one_writer: ClassVar[bool] = True
    tells_other_processes: ClassVar[bool] = False
    compound_writes: ClassVar[bool] = False
    shrinks_its_file: ClassVar[bool] = True

    def engine_url(self, url: str) -> str:
        return "sqlite+aiosqlite://" + url.partition("://")[2]

    async def rows(
        self, conn: AsyncConnection, stmt: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        inline = inline_sqlite(conn)
        if inline is None:  # pragma: no cover - SQLite's connections are inline ones
            found = await conn.execute(stmt, params)
            return [tuple(r) for r in found.all()] if found.returns_rows else []
        rows = await run_raw(inline, stmt, params)
        readers = _readers(stmt, conn.dialect)
        if not readers or not rows:
            return rows
        read = []
        for row in rows:
            values = list(row)
            for i, reader in readers:
                values[i] = reader(values[i])
            read.append(tuple(values))
        return read

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
        columns = tuple(rows[0])
        raw = raw_sqlite(conn)
        if raw is None:  # SQLAlchemy's executemany (the byte-for-byte comparison's other side)
            stmt = insert_statement(table, columns, update_on_conflict, "sqlite")
            await conn.execute(stmt, list(rows))
            return
        sql, plan = _plan(table, columns, update_on_conflict)
        values = [tuple(convert(row[name]) for name, convert in plan) for row in rows]
        try:
            raw.executemany(sql, values)
        except sqlite3.Error as exc:
            raise _refused(sql, exc) from exc

    async def update(self, conn: AsyncConnection, table: Table, rows: Pairs) -> None:
        columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
        raw = raw_sqlite(conn)
        if raw is None:
            await conn.execute(
                update_statement(table, columns, keys), [bound(v, k) for v, k in rows]
            )
            return
        sql, plan = _update_plan(table, columns, keys)
        params = [
            tuple(convert(pair[side][column]) for side, column, convert in plan) for pair in rows
        ]
        try:
            raw.executemany(sql, params)
        except sqlite3.Error as exc:
            raise _refused(sql, exc) from exc

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
        """Row by row on one prepared statement (microseconds each), in the order given;
        ``attached`` rows are inserted after, those of the rows applied."""
        if beside:
            raise ValueError("update_each: beside needs compound writes (PostgreSQL)")
        columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
        applied = await self._guarded(conn, table, rows, columns, keys, guard)
        if attached is not None:
            moved = {key[keys[0]] for (_, key), ok in zip(rows, applied, strict=True) if ok}
            kept = [row for row in attached.rows if row[attached.link] in moved]
            if kept:
                await self.insert(
                    conn, attached.table, kept, update_on_conflict=attached.update_on_conflict
                )
        return applied

    async def _guarded(
        self,
        conn: AsyncConnection,
        table: Table,
        rows: Pairs,
        columns: tuple[str, ...],
        keys: tuple[str, ...],
        guard: str | None,
    ) -> list[bool]:
        raw = raw_sqlite(conn)
        if raw is None:  # SQLAlchemy's path, row by row
            stmt = update_statement(table, columns, keys, guard)
            return [(await conn.execute(stmt, bound(v, k))).rowcount == 1 for v, k in rows]
        sql, plan = _update_plan(table, columns, keys, guard)
        cursor = raw.cursor()
        applied = []
        try:
            for pair in rows:
                cursor.execute(sql, tuple(convert(pair[side][c]) for side, c, convert in plan))
                applied.append(cursor.rowcount == 1)
        except sqlite3.Error as exc:
            raise _refused(sql, exc) from exc
        finally:
            cursor.close()
        return applied

    async def insert_then_read(
        self, conn: AsyncConnection, written: Insert, query: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        await self.insert(conn, written.table, written.rows)
        return await self.rows(conn, query, params)

    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        return None

    async def lock(self, conn: AsyncConnection, name: str) -> None:
        return None

    def locking(self, query: Any, *, skip_locked: bool = False) -> Any:
        return query

    def one_of(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        return column.in_(bindparam(name, expanding=True))

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        return func.max(*values)

    def upsert(self, table: Table) -> Any:
        return sqlite.insert(table)

    def milliseconds_since(self, now: Any, column: Column[Any]) -> ColumnElement[Any]:
        # UTCDateTime on SQLite: integer microseconds since the epoch, read as they are
        micros = bindparam("now", to_micros(now), BigInteger)
        since: ColumnElement[Any] = literal_column(f"{column.table.name}.{column.name}")
        return func.max(0, func.round((micros - since) / 1000.0))

    async def prefer_nested_loops(self, conn: AsyncConnection) -> None:
        return None

    def is_duplicate(self, exc: BaseException) -> bool:
        return any(
            isinstance(seen, sqlite3.IntegrityError)
            and (
                getattr(seen, "sqlite_errorcode", None) in _UNIQUE
                or "UNIQUE constraint failed" in str(seen)
            )
            for seen in causes(exc)
        )
