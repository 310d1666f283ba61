"""Many-row inserts and updates of the hot tables, straight to SQLite's driver.

Every run writes about a dozen rows (itself, its steps, its events, their deliveries). Through
SQLAlchemy's executemany each row costs ~10 µs of parameter processing in Python (a type
processor per value, a datetime formatted through a ``%`` template), a fifth of the engine's
time under load. On SQLite, :func:`insert` hands the rows to ``sqlite3``'s executemany instead,
converted once per column to exactly what SQLAlchemy would have stored (a test compares the
two byte for byte), inside the same transaction; :func:`update` does the same for updates by
key. PostgreSQL keeps SQLAlchemy's path.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import orjson
import sqlalchemy.exc as sa_exc
from sqlalchemy import Table, and_, bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import JSON, TypeEngine

from flowhook.store.sqlite_inline import InlineConnection
from flowhook.store.types import UTCDateTime

__all__ = ["insert", "update", "raw_sqlite"]

Convert = Callable[[Any], Any]


def raw_sqlite(conn: AsyncConnection) -> sqlite3.Connection | None:
    """The ``sqlite3`` connection under ``conn`` (in its transaction), or ``None`` when the
    store is not SQLite on the inline driver."""
    if conn.dialect.name != "sqlite":
        return None
    driver = conn.sync_connection.connection.driver_connection if conn.sync_connection else None
    return driver._conn if isinstance(driver, InlineConnection) else None


def _sqlite_datetime(value: datetime | None) -> str | None:
    # SQLAlchemy's SQLite DATETIME storage: naive UTC, always with microseconds.
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the store")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _sqlite_json(value: Any) -> str:
    return orjson.dumps(value).decode()  # None → 'null', as SQLAlchemy's JSON type stores it


def _same(value: Any) -> Any:
    return value


def _converter(type_: TypeEngine[Any]) -> Convert:
    if isinstance(type_, UTCDateTime):
        return _sqlite_datetime
    if isinstance(type_, JSON):
        return _sqlite_json
    return _same  # strings, numbers, booleans, bytes: sqlite3 stores them as SQLAlchemy does


def _insert_statement(
    table: Table, columns: tuple[str, ...], conflict: tuple[str, ...], dialect: str
) -> Any:
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
    if conflict:
        stmt = stmt.on_conflict_do_update(
            index_elements=list(conflict),
            set_={c: stmt.excluded[c] for c in columns if c not in conflict},
        )
    return stmt


@lru_cache(maxsize=64)
def _plan(
    table: Table, columns: tuple[str, ...], conflict: tuple[str, ...]
) -> tuple[str, list[tuple[str, Convert]]]:
    """The SQL for these columns, compiled once, and each parameter's column and converter
    in the order the SQL binds them."""
    stmt = _insert_statement(table, columns, conflict, "sqlite").values({c: None for c in columns})
    compiled = stmt.compile(dialect=sqlite.dialect())
    order = list(compiled.positiontup or ())
    if sorted(order) != sorted(columns):  # pragma: no cover - each column is bound once
        raise RuntimeError(f"unexpected parameters for {table.name}: {order}")
    types = {c.name: c.type for c in table.columns}
    return str(compiled), [(name, _converter(types[name])) for name in order]


async def insert(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    *,
    update_on_conflict: Sequence[str] = (),
) -> None:
    """Insert ``rows`` (all with the same keys); with ``update_on_conflict`` (the key
    columns), a row whose key exists replaces that row's other columns."""
    if not rows:
        return
    columns = tuple(rows[0])
    conflict = tuple(update_on_conflict)
    raw = raw_sqlite(conn)
    if raw is None:
        stmt = _insert_statement(table, columns, conflict, conn.dialect.name)
        await conn.execute(stmt, list(rows))
        return
    sql, plan = _plan(table, columns, conflict)
    values = [tuple(convert(row[name]) for name, convert in plan) for row in rows]
    try:
        raw.executemany(sql, values)
    except sqlite3.Error as exc:  # as SQLAlchemy would raise it (IntegrityError, …)
        raise sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc


def _update_statement(table: Table, columns: tuple[str, ...], keys: tuple[str, ...]) -> Any:
    return (
        table.update()
        .where(and_(*(table.c[k] == bindparam(f"w_{k}") for k in keys)))
        .values({c: bindparam(f"v_{c}") for c in columns})
    )


@lru_cache(maxsize=64)
def _update_plan(
    table: Table, columns: tuple[str, ...], keys: tuple[str, ...]
) -> tuple[str, list[tuple[int, str, Convert]]]:
    """SQL, and per parameter: 0 for a value or 1 for a key, its column, its converter."""
    compiled = _update_statement(table, columns, keys).compile(dialect=sqlite.dialect())
    types = {c.name: c.type for c in table.columns}
    plan = []
    for name in compiled.positiontup or ():
        side, column = (0, name[2:]) if name.startswith("v_") else (1, name[2:])
        plan.append((side, column, _converter(types[column])))
    return str(compiled), plan


async def update(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """``UPDATE table SET <values> WHERE <key columns = key values>`` for each (values, keys)
    pair of ``rows``; every pair names the same columns."""
    if not rows:
        return
    columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
    raw = raw_sqlite(conn)
    if raw is None:
        await conn.execute(
            _update_statement(table, columns, keys),
            [
                {
                    **{f"v_{c}": v for c, v in values.items()},
                    **{f"w_{k}": v for k, v in key.items()},
                }
                for values, key in rows
            ],
        )
        return
    sql, plan = _update_plan(table, columns, keys)
    params = [tuple(convert(pair[side][column]) for side, column, convert in plan) for pair in rows]
    try:
        raw.executemany(sql, params)
    except sqlite3.Error as exc:
        raise sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
