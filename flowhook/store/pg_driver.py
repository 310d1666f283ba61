"""The PostgreSQL driver: the store's statements on SQLAlchemy's asyncpg adapter, each built
and compiled once, many rows in one statement.

:meth:`PostgresDriver.insert` is one ``INSERT … SELECT … FROM unnest(…)`` for all its rows,
one array parameter per column (the same values as SQLAlchemy's executemany: a test compares
the rows), one execution on the server. :meth:`~PostgresDriver.update` is one ``UPDATE … FROM
unnest(…)``; :meth:`~PostgresDriver.update_each`, the guarded form the state machine writes
with, one ``UPDATE … FROM unnest(…) RETURNING`` per call whose text does not depend on the
number of rows (prepared once), which may write rows of another table for the rows it applied
(``attached``: a run's steps with its move) and run other writes of the same transaction
(``beside``: a delivery's attempt line and its endpoint's health with its move).

:func:`run_pg` runs any other statement built once the same way: compiled once, each list of
ids bound as one array, through the adapter's cursor without SQLAlchemy's execution layer
(:func:`_driver_rows`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, ClassVar

import asyncpg
from sqlalchemy import (
    Column,
    Table,
    and_,
    any_,
    bindparam,
    extract,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.types import JSON, Boolean, Float, String, Text, TypeEngine
from sqlalchemy.util import greenlet_spawn

from flowhook.store.driver import (
    STORED_AS_GIVEN,
    Attached,
    Beside,
    Driver,
    Insert,
    Pairs,
    causes,
    insert_statement,
    last_per_key,
)
from flowhook.store.types import IdType, UTCDateTime

__all__ = [
    "PostgresDriver",
    "run_pg",
    "pg_item_type",
    "unnested",
    "unnested_params",
    "update_beside",
]

Convert = Callable[[Any], Any]


@lru_cache(maxsize=64)
def _pg_insert_statement(table: Table, columns: tuple[str, ...], conflict: tuple[str, ...]) -> Any:
    """PostgreSQL: ``INSERT … SELECT … FROM unnest(<one array per column>) [ON CONFLICT
    (conflict) DO UPDATE SET <the other columns>]``, one statement text for any number of
    rows."""
    return insert_statement(table, columns, conflict, "postgresql", _from_unnest(table, columns))


def _from_unnest(table: Table, columns: tuple[str, ...], prefix: str = "") -> Any:
    """``SELECT <prefix><column>, … FROM (SELECT unnest(:a_<prefix><column>) …) v``: the rows
    given as one array parameter per column (:func:`unnested`)."""
    rows = unnested(table, [(f"{prefix}{c}", c) for c in columns])
    return select(*(rows.c[f"{prefix}{c}"] for c in columns))


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
        rows = last_per_key(rows, conflict)
    await run_pg(conn, _pg_insert_statement(table, columns, conflict), unnested_params(rows))


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


@lru_cache(maxsize=16)
def _insert_notifying(
    table: Table, columns: tuple[str, ...], conflict: tuple[str, ...], channel: str
) -> Any:
    """``WITH written AS (INSERT … SELECT … FROM unnest(…)) SELECT pg_notify(channel,
    :notice)``: the rows inserted and the ``NOTIFY`` sent in one statement, one round trip
    where they took two, and atomic on its own, so it may run in autocommit
    (:meth:`~flowhook.store.db.Database.statement`). A data-modifying CTE runs whether the
    query reads it or not; the notification goes out when the statement's transaction
    commits, as a ``NOTIFY``'s does."""
    written = _pg_insert_statement(table, columns, conflict)
    notice = bindparam("notice", type_=String)
    return select(func.pg_notify(channel, notice, type_=Text)).add_cte(written.cte())  # void


def update_beside(table: Table, rows: Pairs, label: str) -> Beside:
    """:meth:`PostgresDriver.update` of ``rows`` as a statement to run beside a guarded
    update (:class:`~flowhook.store.driver.Beside`), its
    parameters named apart by ``label`` (``a_<label>v_<column>``, ``a_<label>k_<key>``)."""
    columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
    stmt = _unnest_statement(table, columns, keys, None, False, returning=False, prefix=label)
    return Beside(stmt, _arrays(rows, label))


async def _written_then_read(
    conn: AsyncConnection, written: Insert, query: Any, params: dict[str, Any]
) -> list[Any]:
    """``written``'s rows inserted (and its ``NOTIFY`` sent at commit) and ``query``'s rows
    read (:func:`run_pg`), in one statement: one round trip where they took two. ``query``
    (a statement built once, whose parameter names do not start with ``a_``) reads the
    database as it was before the insert, as any statement of one snapshot does."""
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
        # updated (a semi join's inner side), several times slower (bench/README.md).
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


async def _guarded_update(
    conn: AsyncConnection,
    table: Table,
    rows: Pairs,
    *,
    guard: str | None,
    ordered: bool,
    attached: Attached | None,
    beside: Sequence[Beside],
) -> list[bool]:
    """:meth:`PostgresDriver.update_each`: one ``UPDATE … FROM unnest(…) RETURNING`` whose
    rows say which keys it applied; with ``ordered`` its rows locked first in the order of
    the first key column (the lock order rule); ``attached`` written by the same statement
    (:func:`_attach`) and ``beside`` run in it (:func:`_beside`): one round trip for all."""
    columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
    stmt = _unnest_statement(table, columns, keys, guard, ordered)
    params = _arrays(rows)
    if attached is not None:
        conflict = attached.update_on_conflict
        extra = last_per_key(attached.rows, conflict) if conflict else attached.rows
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
    written = insert_statement(table, columns, conflict, "postgresql", chosen)
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


def _arrays(rows: Pairs, prefix: str = "") -> dict[str, list[Any]]:
    """The parameters of :func:`_unnest_statement` for ``rows``: one list per column."""
    columns, keys = rows[0]
    params = {f"a_{prefix}v_{c}": [values[c] for values, _ in rows] for c in columns}
    params.update({f"a_{prefix}k_{k}": [key[k] for _, key in rows] for k in keys})
    return params


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


_READ_AS_GIVEN: frozenset[type[TypeEngine[Any]]] = STORED_AS_GIVEN | {Boolean, Float}
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
    raise TypeError(f"run_pg: no reading known for a column of {type_!r}; add one to pg_driver.py")


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
    SQLAlchemy's execution layer around it: a statement cost more of the process's CPU
    through ``exec_driver_sql``, and a run's progress on PostgreSQL is about eight of them
    (bench/README.md, "Figures moved from docstrings"). An error goes through SQLAlchemy's
    handling as it would have (``DBAPIError``, a connection the server closed invalidated
    with the pool's older ones).
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
    only the values that need it are processed: a read of 64 due deliveries costs less of
    the process's CPU than through SQLAlchemy (bench/README.md, "Figures moved from
    docstrings"). (Most of the claim's gain came
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


_DUPLICATE = (asyncpg.exceptions.UniqueViolationError,)


class PostgresDriver(Driver):
    name: ClassVar[str] = "postgresql"
    label: ClassVar[str] = "PostgreSQL"
    one_writer: ClassVar[bool] = False
    tells_other_processes: ClassVar[bool] = True
    compound_writes: ClassVar[bool] = True
    shrinks_its_file: ClassVar[bool] = False

    def engine_url(self, url: str) -> str:
        return "postgresql+asyncpg://" + url.partition("://")[2]

    async def rows(
        self, conn: AsyncConnection, stmt: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        return await run_pg(conn, stmt, params)

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
        if channel is None:
            await _insert_pg(conn, table, columns, update_on_conflict, rows)
            return
        if update_on_conflict:
            rows = last_per_key(rows, update_on_conflict)
        stmt = _insert_notifying(table, columns, update_on_conflict, channel)
        await run_pg(conn, stmt, {**unnested_params(rows), "notice": notice})

    async def update(self, conn: AsyncConnection, table: Table, rows: Pairs) -> None:
        columns, keys = tuple(rows[0][0]), tuple(rows[0][1])
        stmt = _unnest_statement(table, columns, keys, None, False, returning=False)
        await run_pg(conn, stmt, _arrays(rows))  # one statement, prepared once

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
        return await _guarded_update(
            conn, table, rows, guard=guard, ordered=ordered, attached=attached, beside=beside
        )

    async def insert_then_read(
        self, conn: AsyncConnection, written: Insert, query: Any, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        return await _written_then_read(conn, written, query, params)

    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        await conn.execute(text(f"NOTIFY {channel}"))

    async def lock(self, conn: AsyncConnection, name: str) -> None:
        key = func.hashtextextended(name, 0)
        await conn.execute(select(func.pg_advisory_xact_lock(key)))

    def locking(self, query: Any, *, skip_locked: bool = False) -> Any:
        return query.with_for_update(skip_locked=skip_locked)

    def one_of(self, column: ColumnElement[Any], name: str) -> ColumnElement[bool]:
        item = pg_item_type(column.type)
        return column == any_(bindparam(name, type_=postgresql.ARRAY(item, dimensions=1)))

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        return func.greatest(*values)

    def upsert(self, table: Table) -> Any:
        return postgresql.insert(table)

    def milliseconds_since(self, now: Any, column: Column[Any]) -> ColumnElement[Any]:
        at = bindparam("now", now, type_=UTCDateTime())
        return func.greatest(0, func.round(extract("epoch", at - column) * 1000))

    async def prefer_nested_loops(self, conn: AsyncConnection) -> None:
        await conn.execute(text("SET LOCAL enable_mergejoin = off"))

    def is_duplicate(self, exc: BaseException) -> bool:
        return any(
            isinstance(seen, _DUPLICATE) or getattr(seen, "sqlstate", None) == "23505"
            for seen in causes(exc)
        )
