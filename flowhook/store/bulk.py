"""Many-row inserts and updates of the hot tables, straight to SQLite's driver.

Every run writes about a dozen rows (itself, its steps, its events, their deliveries). Through
SQLAlchemy's executemany each row costs ~10 µs of parameter processing in Python (a type
processor per value, a datetime formatted through a ``%`` template), a fifth of the engine's
time under load. On SQLite, :func:`insert` hands the rows to ``sqlite3``'s executemany instead,
converted once per column to exactly what SQLAlchemy would have stored (a test compares the
two byte for byte), inside the same transaction; :func:`update` does the same for updates by
key. On PostgreSQL :func:`insert` is one ``INSERT … SELECT … FROM unnest(…)`` for all its
rows, one array parameter per column, through the driver (:func:`run_pg`): the same values
as SQLAlchemy's executemany (a test compares the rows), one execution on the server.

:func:`update` on PostgreSQL is one ``UPDATE … FROM unnest(…)`` (as below) for all its rows.
:func:`update_each` is the guarded form the state machine writes with: each row's update
carries a guard (its status among the legal sources, the lease owner), and the caller learns
row by row which ones the database applied. On SQLite that is one execution per row on the
same prepared statement (microseconds each); on PostgreSQL one ``UPDATE … FROM unnest(…)
RETURNING`` per call, whose text does not depend on the number of rows, so it is prepared once,
and which may write rows of another table for the rows it applied (``attached``: a run's
steps with its move) and run other writes of the same transaction (``beside``: a delivery's
attempt line and its endpoint's health with its move).

:func:`run_raw` runs any other statement built once with named bind parameters (the
dispatcher's claim and its due-time probe, many times a second) the same way: compiled for
SQLite once, then handed to ``sqlite3`` with its parameters converted as SQLAlchemy would.
:func:`run_pg` is its PostgreSQL side: compiled once, each list of ids bound as one array,
through the driver.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

import orjson
import sqlalchemy.exc as sa_exc
from sqlalchemy import Column, Table, and_, any_, bindparam, func, literal_column, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select
from sqlalchemy.types import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    TypeEngine,
)
from sqlalchemy.util import greenlet_spawn

from flowhook.ids import pack_id, unpack_id
from flowhook.store.sqlite_inline import InlineConnection
from flowhook.store.types import IdType, UTCDateTime, stored_datetime, to_micros

__all__ = [
    "insert",
    "update",
    "update_each",
    "unnested",
    "unnested_params",
    "pg_item_type",
    "insert_notifying",
    "Attached",
    "Insert",
    "insert_then_read",
    "raw_sqlite",
    "inline_sqlite",
    "run_raw",
    "run_pg",
    "stored_datetime",
]

Convert = Callable[[Any], Any]


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


_STORED_AS_GIVEN: frozenset[type[TypeEngine[Any]]] = frozenset(
    {String, Text, Integer, SmallInteger, BigInteger, LargeBinary}
)
"""Types whose values ``sqlite3`` stores as SQLAlchemy's SQLite dialect does (no bind
processing). Exact classes: a subclass (``Enum`` is a ``String``) may process its values."""


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
    if type(type_) in _STORED_AS_GIVEN:
        return _same
    if type(type_) is Boolean:
        return _sqlite_bool
    raise TypeError(
        f"bulk: no SQLite conversion known for {column.table.name}.{column.name} ({type_!r});"
        " add one to flowhook/store/bulk.py and the table to tests/integration/test_bulk_insert.py"
    )


def _insert_statement(
    table: Table,
    columns: tuple[str, ...],
    conflict: tuple[str, ...],
    dialect: str,
    source: Any = None,
) -> Any:
    """``INSERT INTO table`` (``… SELECT <source>`` when given) and, with ``conflict`` (the
    key columns), ``ON CONFLICT (conflict) DO UPDATE SET <the other columns>``."""
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
    if source is not None:
        stmt = stmt.from_select(list(columns), source)
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
    return str(compiled), [(name, _converter(table.c[name])) for name in order]


@lru_cache(maxsize=64)
def _pg_insert_statement(table: Table, columns: tuple[str, ...], conflict: tuple[str, ...]) -> Any:
    """PostgreSQL: ``INSERT … SELECT … FROM unnest(<one array per column>) [ON CONFLICT
    (conflict) DO UPDATE SET <the other columns>]``, one statement text for any number of
    rows."""
    return _insert_statement(table, columns, conflict, "postgresql", _from_unnest(table, columns))


def _from_unnest(table: Table, columns: tuple[str, ...], prefix: str = "") -> Any:
    """``SELECT <prefix><column>, … FROM (SELECT unnest(:a_<prefix><column>) …) v``: the rows
    given as one array parameter per column (:func:`unnested`)."""
    rows = unnested(table, [(f"{prefix}{c}", c) for c in columns])
    return select(*(rows.c[f"{prefix}{c}"] for c in columns))


def _last_per_key(rows: Sequence[dict[str, Any]], key: tuple[str, ...]) -> Sequence[dict[str, Any]]:
    """``rows`` with, of those that share a value of ``key``, only the last: what one row
    after another would have left, which one statement cannot do (PostgreSQL refuses an
    ``ON CONFLICT DO UPDATE`` that meets its own row twice)."""
    last = {tuple(row[k] for k in key): row for row in rows}
    return rows if len(last) == len(rows) else list(last.values())


async def _insert_pg(
    conn: AsyncConnection,
    table: Table,
    columns: tuple[str, ...],
    conflict: tuple[str, ...],
    rows: Sequence[dict[str, Any]],
) -> None:
    """The rows in one statement (:func:`_pg_insert_statement`), each column's values one
    array, through the driver (:func:`run_pg`): one execution on the server whatever the
    number of rows, where asyncpg's executemany ran the insert once per row (and went
    through SQLAlchemy's execution layer, ``exec_driver_sql``). The values are those
    SQLAlchemy's own executemany would store (a test compares the rows)."""
    if conflict:
        rows = _last_per_key(rows, conflict)
    await run_pg(conn, _pg_insert_statement(table, columns, conflict), unnested_params(rows))


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
        if conn.dialect.name == "postgresql":
            await _insert_pg(conn, table, columns, conflict, rows)
        else:  # pragma: no cover - SQLite's connections are inline ones
            await conn.execute(_insert_statement(table, columns, conflict, "sqlite"), list(rows))
        return
    sql, plan = _plan(table, columns, conflict)
    values = [tuple(convert(row[name]) for name, convert in plan) for row in rows]
    try:
        raw.executemany(sql, values)
    except sqlite3.Error as exc:  # as SQLAlchemy would raise it (IntegrityError, …)
        raise sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc


def _update_statement(
    table: Table, columns: tuple[str, ...], keys: tuple[str, ...], guard: str | None = None
) -> Any:
    stmt = (
        table.update()
        .where(and_(*(table.c[k] == bindparam(f"w_{k}") for k in keys)))
        .values({c: bindparam(f"v_{c}") for c in columns})
    )
    return stmt if guard is None else stmt.where(text(guard))


@lru_cache(maxsize=64)
def _update_plan(
    table: Table, columns: tuple[str, ...], keys: tuple[str, ...], guard: str | None = None
) -> tuple[str, list[tuple[int, str, Convert]]]:
    """SQL, and per parameter: 0 for a value or 1 for a key, its column, its converter."""
    compiled = _update_statement(table, columns, keys, guard).compile(dialect=sqlite.dialect())
    plan = []
    for name in compiled.positiontup or ():
        side, column = (0, name[2:]) if name.startswith("v_") else (1, name[2:])
        plan.append((side, column, _converter(table.c[column])))
    return str(compiled), plan


def _bound(values: dict[str, Any], key: dict[str, Any]) -> dict[str, Any]:
    """One row's parameters for :func:`_update_statement` (SQLAlchemy's path)."""
    return {**{f"v_{c}": v for c, v in values.items()}, **{f"w_{k}": v for k, v in key.items()}}


async def update(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """``UPDATE table SET <values> WHERE <key columns = key values>`` for each (values, keys)
    pair of ``rows``; every pair names the same columns. Unguarded: for writes whose rows
    the caller already holds (an attempt's log line); state changes use :func:`update_each`."""
    if not rows:
        return
    columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
    raw = raw_sqlite(conn)
    if raw is None:
        if conn.dialect.name == "postgresql":  # one statement, prepared once: see update_each
            stmt = _unnest_statement(table, columns, keys, None, False, returning=False)
            await run_pg(conn, stmt, _arrays(rows))
        else:  # pragma: no cover - SQLite's connections are inline ones
            await conn.execute(
                _update_statement(table, columns, keys),
                [_bound(values, key) for values, key in rows],
            )
        return
    sql, plan = _update_plan(table, columns, keys)
    params = [tuple(convert(pair[side][column]) for side, column, convert in plan) for pair in rows]
    try:
        raw.executemany(sql, params)
    except sqlite3.Error as exc:
        raise sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc


def pg_item_type(type_: TypeEngine[Any]) -> TypeEngine[Any]:
    # JSON columns are JSONB on PostgreSQL (a variant the ARRAY type would not resolve)
    if isinstance(type_, JSON):
        return postgresql.JSONB(none_as_null=type_.none_as_null)
    # A string's length is the column's to check: PostgreSQL's cast to varchar(n) cuts a
    # longer value short without an error, where writing it to the column refuses it.
    if type(type_) is String and type_.length is not None:
        return String()
    return type_


def _array_param(table: Table, label: str, column: str) -> Any:
    """The parameter ``a_<label>``: an array of ``table.column``'s type, of one dimension
    (else SQLAlchemy would take a JSON value that is a list, in the first row, for a second
    dimension and process its elements one by one)."""
    item = pg_item_type(table.c[column].type)
    return bindparam(f"a_{label}", type_=postgresql.ARRAY(item, dimensions=1))


def unnested(table: Table, names: Sequence[tuple[str, str]]) -> Any:
    """PostgreSQL: ``(SELECT unnest(:a_<label>) AS <label>, …) AS v``, rows given as one
    array parameter per column: per ``(label, column)`` of ``names``, the array ``a_<label>``
    of ``table``'s column's type. Any number of rows is one statement text."""
    return select(
        *(
            func.unnest(_array_param(table, label, n), type_=table.c[n].type).label(label)
            for label, n in names
        )
    ).subquery("v")


def unnested_params(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """The parameters of :func:`unnested` with labels that are the column names, for rows
    that all have the same keys: ``a_<column>``, the column's values in row order."""
    return {f"a_{c}": [row[c] for row in rows] for c in rows[0]}


async def insert_notifying(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    channel: str,
    notice: str = "",
) -> None:
    """PostgreSQL: ``rows`` (all with the same keys) inserted and ``NOTIFY channel, notice``
    in one statement: one round trip where an insert and a ``NOTIFY`` took two, and atomic
    on its own, so it may run in autocommit (:meth:`~flowhook.store.db.Database.statement`).
    The notification goes out when the statement's transaction commits, as a ``NOTIFY``'s
    does."""
    stmt = _insert_notifying(table, tuple(rows[0]), channel)
    await run_pg(conn, stmt, {**unnested_params(rows), "notice": notice})


@lru_cache(maxsize=16)
def _insert_notifying(table: Table, columns: tuple[str, ...], channel: str) -> Any:
    """``WITH written AS (INSERT … SELECT … FROM unnest(…)) SELECT pg_notify(channel,
    :notice)``: a data-modifying CTE runs whether the query reads it or not."""
    written = _pg_insert_statement(table, columns, ())
    notice = bindparam("notice", type_=String)
    return select(func.pg_notify(channel, notice, type_=Text)).add_cte(written.cte())  # void


class Insert(NamedTuple):
    """Rows to insert into ``table`` (all with the same keys) in the statement of a query
    (:func:`insert_then_read`), with ``NOTIFY channel, notice`` unless ``channel`` is
    ``None``."""

    table: Table
    rows: Sequence[dict[str, Any]]
    channel: str | None = None
    notice: str = ""


class Attached(NamedTuple):
    """Rows inserted into ``table`` by a guarded update (:func:`update_each`), those of the
    rows it applied only: a row goes in when its ``link`` column holds the first key of an
    updated row. ``update_on_conflict``: as :func:`insert`'s."""

    table: Table
    rows: Sequence[dict[str, Any]]
    link: str
    update_on_conflict: tuple[str, ...] = ()


class Beside(NamedTuple):
    """A statement that a guarded update (:func:`update_each`) runs inside its own
    statement on PostgreSQL, after the update: built once (its parameters named apart from
    the update's, none starting with ``a_v_`` or ``a_k_``), with this call's parameters. Its
    rows are not read. For writes that belong in the update's transaction whatever it
    applied."""

    statement: Any
    params: dict[str, Any]


def update_beside(
    table: Table, rows: Sequence[tuple[dict[str, Any], dict[str, Any]]], label: str
) -> Beside:
    """:func:`update` of ``rows`` as a statement to run beside a guarded update, its
    parameters named apart by ``label`` (``a_<label>v_<column>``, ``a_<label>k_<key>``)."""
    columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
    stmt = _unnest_statement(table, columns, keys, None, False, returning=False, prefix=label)
    return Beside(stmt, _arrays(rows, label))


async def insert_then_read(
    conn: AsyncConnection, written: Insert, query: Any, params: dict[str, Any]
) -> list[Any]:
    """PostgreSQL: ``written``'s rows inserted (and its ``NOTIFY`` sent at commit) and
    ``query``'s rows read (:func:`run_pg`), in one statement: one round trip where they
    took two. ``query`` (a statement built once, whose parameter names do not start with
    ``a_``) reads the database as it was before the insert, as any statement of one
    snapshot does: it must not look for the rows written."""
    stmt = _insert_then_read(written.table, tuple(written.rows[0]), written.channel, query)
    values = {**unnested_params(written.rows), **params}
    if written.channel is not None:
        values["notice"] = written.notice
    return await run_pg(conn, stmt, values)


@lru_cache(maxsize=16)
def _insert_then_read(
    table: Table, columns: tuple[str, ...], channel: str | None, query: Any
) -> Any:
    """``WITH written AS (INSERT … FROM unnest(…)) [, told AS MATERIALIZED (SELECT
    pg_notify(…))] <query> [AND (SELECT count(*) FROM told) >= 0]``. A data-modifying CTE
    runs whether the query reads it or not; the ``NOTIFY`` is read to its end by a one-time
    condition (always true), evaluated once before the query's rows whether it finds any or
    not (as :func:`_unnest_statement` locks its rows)."""
    stmt = query.add_cte(_pg_insert_statement(table, columns, ()).cte("written"))
    if channel is not None:
        notice = bindparam("notice", type_=String)
        told = (
            select(func.pg_notify(channel, notice, type_=Text).label("told"))
            .cte("told")
            .prefix_with("MATERIALIZED")
        )
        sent = select(func.count()).select_from(told).scalar_subquery()
        stmt = stmt.where(sent >= literal_column("0"))
    return stmt


@lru_cache(maxsize=64)
def _unnest_statement(
    table: Table,
    columns: tuple[str, ...],
    keys: tuple[str, ...],
    guard: str | None,
    ordered: bool,
    returning: bool = True,
    prefix: str = "",
) -> Any:
    """``UPDATE table SET c = v.c … FROM unnest(<one array per column>) v WHERE <keys match>
    AND <guard> [RETURNING <keys>]``: one statement for any number of rows. ``ordered``: the
    rows are first locked in the order of the first key column, in the same statement.
    ``prefix`` goes before its parameters' labels (:func:`_arrays`), for a second update in
    one statement."""
    names = [(f"{prefix}v_{c}", c) for c in columns] + [(f"{prefix}k_{k}", k) for k in keys]
    v = unnested(table, names)
    stmt = (
        table.update()
        .where(and_(*(table.c[k] == v.c[f"{prefix}k_{k}"] for k in keys)))
        .values({c: v.c[f"{prefix}v_{c}"] for c in columns})
    )
    if returning:
        stmt = stmt.returning(*(v.c[f"{prefix}k_{k}"] for k in keys))
    if ordered:
        # The rows are locked in a CTE that a one-time condition reads to its end (a count,
        # always true), so before any row is updated and once. Referenced as ``IN (SELECT
        # … FOR UPDATE)`` instead, PostgreSQL ran the locking scan again for every row it
        # updated (a semi join's inner side): 128 rows took 39 ms, this 4-6 ms.
        first = table.c[keys[0]]
        locked = (
            select(first)
            .where(first == any_(_array_param(table, f"{prefix}k_{keys[0]}", keys[0])))
            .order_by(first)
            .with_for_update(key_share=True)  # what the UPDATE takes: FOR NO KEY UPDATE
            .cte("locked")
            .prefix_with("MATERIALIZED")
        )
        all_locked = select(func.count()).select_from(locked).scalar_subquery()
        stmt = stmt.where(all_locked >= literal_column("0"))
    return stmt if guard is None else stmt.where(text(guard))


async def update_each(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[tuple[dict[str, Any], dict[str, Any]]],
    *,
    guard: str | None = None,
    ordered: bool = False,
    attached: Attached | None = None,
    beside: Sequence[Beside] = (),
) -> list[bool]:
    """:func:`update` with a guard, telling for each row whether the database applied it.

    ``guard`` is a condition in SQL with no parameters (statuses written out, as the partial
    indexes want them), added to every row's key match; key columns that must match a value
    (the lease owner) go in the row's keys. Rows are updated in the order given on SQLite;
    on PostgreSQL, with ``ordered``, they are locked in the order of the first key column
    (the lock order rule), else the caller locks them first when the order matters.

    ``attached``: rows to insert with those the database applied (a run's steps with its
    move); on PostgreSQL in the update's statement (:func:`_attach`), one round trip for
    both.

    ``beside``: PostgreSQL only (the caller runs its own statements on SQLite): statements
    run after the update in its statement (:func:`_beside`), one round trip for all. They
    need rows to update: without any, nothing runs, ``beside`` included."""
    if not rows:
        return []
    if beside and conn.dialect.name != "postgresql":
        raise ValueError("update_each: beside is for PostgreSQL")
    columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
    if attached is not None and not attached.rows:
        attached = None
    if attached is not None and conn.dialect.name != "postgresql":
        applied = await update_each(conn, table, rows, guard=guard, ordered=ordered)
        moved = {key[keys[0]] for (_, key), ok in zip(rows, applied, strict=True) if ok}
        kept = [row for row in attached.rows if row[attached.link] in moved]
        await insert(conn, attached.table, kept, update_on_conflict=attached.update_on_conflict)
        return applied
    raw = raw_sqlite(conn)
    if raw is not None:
        sql, plan = _update_plan(table, columns, keys, guard)
        cursor = raw.cursor()
        applied = []
        try:
            for pair in rows:
                cursor.execute(sql, tuple(convert(pair[side][c]) for side, c, convert in plan))
                applied.append(cursor.rowcount == 1)
        except sqlite3.Error as exc:
            raise sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
        finally:
            cursor.close()
        return applied
    if conn.dialect.name != "postgresql":  # SQLite on another driver
        stmt = _update_statement(table, columns, keys, guard)
        return [
            (await conn.execute(stmt, _bound(values, key))).rowcount == 1 for values, key in rows
        ]
    stmt = _unnest_statement(table, columns, keys, guard, ordered)
    params = _arrays(rows)
    if attached is not None:
        conflict = attached.update_on_conflict
        extra = _last_per_key(attached.rows, conflict) if conflict else attached.rows
        stmt = _attach(stmt, keys[0], attached.table, tuple(extra[0]), attached.link, conflict)
        params.update({f"a_s_{c}": [row[c] for row in extra] for c in extra[0]})
    if beside:
        stmt = _beside(stmt, tuple(b.statement for b in beside))
        for b in beside:
            params.update(b.params)
    matched = set(await run_pg(conn, stmt, params))
    return [tuple(key[k] for k in keys) in matched for _, key in rows]


@lru_cache(maxsize=32)
def _attach(
    update_stmt: Any,
    key: str,
    table: Table,
    columns: tuple[str, ...],
    link: str,
    conflict: tuple[str, ...],
) -> Any:
    """``WITH moved AS (<update_stmt> RETURNING <keys>), attached AS (INSERT INTO table
    SELECT … FROM unnest(…) s WHERE s.link IN (SELECT k_<key> FROM moved) [ON CONFLICT …])
    SELECT * FROM moved``: the rows of ``table`` of the updated rows alone, in one statement.
    Its parameters: the update's, and ``a_s_<column>`` per column inserted."""
    moved = update_stmt.cte("moved")
    source = _from_unnest(table, columns, "s_")
    chosen = source.where(source.selected_columns[f"s_{link}"].in_(select(moved.c[f"k_{key}"])))
    written = _insert_statement(table, columns, conflict, "postgresql", chosen)
    return select(*moved.c).add_cte(written.cte("attached"))


@lru_cache(maxsize=16)
def _beside(stmt: Any, statements: tuple[Any, ...]) -> Any:
    """``WITH moved AS (<stmt>), beside_0 AS (<statement>), … SELECT * FROM moved`` (or
    ``stmt``, already a query of ``moved``, with the statements added to its ``WITH``).

    The query reads ``moved`` to its end, so its rows are locked and written first;
    PostgreSQL then runs the data-modifying statements no one reads, each to its end, before
    the statement returns. Among themselves their order is PostgreSQL's: they must not
    depend on each other's rows or lock rows in an order that matters."""
    if not isinstance(stmt, Select):
        stmt = select(*stmt.cte("moved").c)
    for i, statement in enumerate(statements):
        stmt = stmt.add_cte(statement.cte(f"beside_{i}"))
    return stmt


def _arrays(
    rows: Sequence[tuple[dict[str, Any], dict[str, Any]]], prefix: str = ""
) -> dict[str, list[Any]]:
    """The parameters of :func:`_unnest_statement` for ``rows``: one list per column."""
    columns, keys = rows[0]
    params = {f"a_{prefix}v_{c}": [values[c] for values, _ in rows] for c in columns}
    params.update({f"a_{prefix}k_{k}": [key[k] for _, key in rows] for k in keys})
    return params


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
        bound = compiled.binds[name].type
        order.append((name, _packed if isinstance(bound, IdType) else _raw_value))
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
        raise sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc
    return [_unpacked(row, ids) for row in rows] if ids else rows


_NUMBERED = re.compile(r"\$(\d+)")


@lru_cache(maxsize=128)
def _pg_raw_plan(
    stmt: Any, dialect: Any
) -> tuple[str, tuple[tuple[str, bool, Convert | None], ...], dict[str, Any], tuple[Any, ...]]:
    """``stmt`` compiled for PostgreSQL once, each list of an ``IN`` (an ``expanding``
    parameter) bound as one array (``= ANY ($n)``, ``<> ALL ($n)``: one text, prepared once,
    whatever the list's length); the parameters in the order the SQL numbers them, each with
    whether it is such a list and SQLAlchemy's bind processor for it; the values SQLAlchemy
    bound itself; and per column read, its result processor (``None``: as the driver gives
    it). An array parameter (``unnest``'s) is a value as any other."""
    compiled = stmt.compile(dialect=dialect)
    sql = str(compiled)
    names = list(compiled.positiontup or ())
    lists = {n for n in names if compiled.binds[n].expanding}
    single = [n for n in names if n not in lists]
    if sorted({int(n) for n in _NUMBERED.findall(sql)}) != list(range(1, len(single) + 1)):
        raise RuntimeError(f"run_pg: unexpected numbering of {names} in {sql}")  # pragma: no cover
    processors = compiled._bind_processors
    order = [(n, False, processors.get(n)) for n in single]
    for name in (n for n in names if n in lists):
        bound = compiled.binds[name].type
        cast = dialect.type_compiler_instance.process(bound.dialect_impl(dialect))
        number = len(order) + 1
        before = sql
        sql = sql.replace(f" NOT IN (__[POSTCOMPILE_{name}])", f" <> ALL (${number}::{cast}[])")
        sql = sql.replace(f" IN (__[POSTCOMPILE_{name}])", f" = ANY (${number}::{cast}[])")
        if sql == before:  # pragma: no cover - a list bound elsewhere than in an IN
            raise ValueError(f"run_pg: {name!r} is not the list of an IN: {sql}")
        order.append((name, True, processors.get(name)))
    if "__[POSTCOMPILE_" in sql:
        raise ValueError(f"run_pg: a list parameter was given no list: {sql}")
    own = {n: compiled.binds[n].effective_value for n in single if not compiled.binds[n].required}
    read = tuple(_pg_reader(c.type, dialect) for c in stmt.exported_columns)
    return sql, tuple(order), own, read


_READ_AS_GIVEN: frozenset[type[TypeEngine[Any]]] = _STORED_AS_GIVEN | {Boolean, Float}
"""Types whose values asyncpg reads as SQLAlchemy gives them (no result processing)."""


def _pg_reader(type_: TypeEngine[Any], dialect: Any) -> Convert | None:
    """How a value asyncpg read is made what SQLAlchemy would give (``None``: as it is). A
    type with no known reading fails the plan instead of passing a value SQLAlchemy would
    have made something else."""
    if type(type_) in (IdType, UTCDateTime):
        return type_.result_processor(dialect, None)
    if type(type_) is JSON:  # JSONB here: read as SQLAlchemy's own dialect reads it
        return type_.dialect_impl(dialect).result_processor(dialect, None)
    if type(type_) in _READ_AS_GIVEN:
        return None
    raise TypeError(f"run_pg: no reading known for a column of {type_!r}; add one to bulk.py")


def _failed(sync: Any, exc: BaseException, sql: str, values: Any, cursor: Any) -> None:
    """SQLAlchemy's handling of ``exc`` raised by ``sql`` on ``sync``'s connection (run in a
    greenlet, as there: invalidating a connection may wait for it to close)."""
    try:
        raise exc
    except BaseException as raised:  # noqa: BLE001 - the handler reads the one being handled
        sync._handle_dbapi_exception(raised, sql, values, cursor, None)


def _watched(dispatch: Any) -> bool:
    """Whether a listener watches the statements of a connection or engine."""
    return bool(
        dispatch.before_execute
        or dispatch.after_execute
        or dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
    )


async def _driver_rows(conn: AsyncConnection, sql: str, values: tuple[Any, ...]) -> list[Any]:
    """PostgreSQL: ``sql`` run on the asyncpg adapter under ``conn`` (SQLAlchemy's own
    ``AsyncAdapt_asyncpg_cursor``: the transaction SQLAlchemy began, started lazily by the
    adapter as for any statement; its cache of prepared statements; its exceptions), without
    SQLAlchemy's execution layer around it: a statement cost ~290 µs of the process's CPU
    through ``exec_driver_sql`` against ~195 µs here, and a run's progress on PostgreSQL is
    about eight of them. An error goes through SQLAlchemy's handling as it would have
    (``DBAPIError``, a connection the server closed invalidated with the pool's older ones).
    A cancelled statement drops the connection, as there (its protocol state is unknown).
    Its rows (asyncpg records), none for a statement without a result.

    SQLAlchemy's transaction is begun first if it is not (its autobegin), so its state is
    what its own execute would leave. A connection that was invalidated (it reconnects
    there), or one whose statements a listener watches (``before_cursor_execute`` and the
    like: a tracer, a test counting them), goes through ``exec_driver_sql``. What this relies
    on inside SQLAlchemy (pinned ``>=2.1,<2.2``) is checked by
    ``tests/integration/test_pg_driver_path.py``."""
    sync = conn.sync_connection
    if (
        sync is None
        or sync.invalidated
        or _watched(sync.dispatch)
        or _watched(sync.engine.dispatch)
    ):
        result = await conn.exec_driver_sql(sql, values)  # it reconnects, or fires the events
        return list(result.all()) if result.returns_rows else []
    if not sync.in_transaction():
        sync._autobegin()  # as SQLAlchemy's execute does (no round trip: the adapter's is lazy)
    cursor = sync.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        await cursor._prepare_and_execute(sql, values)
    except BaseException as exc:  # a cancellation too
        await greenlet_spawn(_failed, sync, exc, sql, values, cursor)
        raise  # pragma: no cover - _failed always raises
    return list(cursor._rows) if cursor.description is not None else []


async def run_pg(conn: AsyncConnection, stmt: Any, params: dict[str, Any]) -> list[Any]:
    """Execute ``stmt`` (a statement built once, its values all named bind parameters; a
    list for an ``expanding`` one) on PostgreSQL through the driver (:func:`_driver_rows`:
    SQLAlchemy's transaction and error translation, not its execution layer) and return its
    rows as tuples of the values SQLAlchemy would give; on another database through
    SQLAlchemy.

    The dispatcher's statements run many times a second with lists of up to 64 ids. Through
    SQLAlchemy each execution wrote its ``IN (…)`` out again (a placeholder and a cast per
    id, a statement text per list length, each text prepared anew) and ran a type processor
    per value read. Here each list is one array parameter, the SQL is compiled once, and
    only the values that need it are processed: a read of 64 due deliveries costs 0.79 ms of
    the process's CPU against 0.96 ms through SQLAlchemy. (Most of the claim's gain came
    from making it one statement, not from this path.)"""
    if conn.dialect.name != "postgresql":
        found = await conn.execute(stmt, params)
        return list(found.all()) if found.returns_rows else []
    sql, order, own, read = _pg_raw_plan(stmt, conn.dialect)
    values: list[Any] = []
    for name, many, bind in order:
        value = own[name] if name in own else params[name]  # a value SQLAlchemy bound itself
        if bind is None:
            values.append(list(value) if many else value)
        else:
            values.append([bind(v) for v in value] if many else bind(value))
    rows = await _driver_rows(conn, sql, tuple(values))
    if not rows:
        return []
    if not any(read):
        return [tuple(r) for r in rows]
    return [
        tuple(v if p is None or v is None else p(v) for v, p in zip(r, read, strict=True))
        for r in rows
    ]
