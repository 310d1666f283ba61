"""PostgreSQL: the store's raw statements (``pg_driver.run_pg``, ``bulk.update_each``) run on SQLAlchemy's asyncpg
adapter without SQLAlchemy's execution layer (``pg_driver._driver_rows``). They must still behave
as through SQLAlchemy: inside the block's transaction, or each alone in autocommit; errors as
``DBAPIError``; a connection the server closed, or a statement cancelled halfway, dropped
from the pool; and a listener on the engine's statements sees every one. These tests also
fail if an upgrade of SQLAlchemy moves what that path relies on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import sqlalchemy.exc as sa_exc
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    event,
    func,
    insert,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.errors import StoreUnavailable
from flowhook.store import bulk, driver, pg_driver
from flowhook.store import db as db_module
from flowhook.store.db import Database
from flowhook.store.tables import metadata
from tests.integration import test_pg_pool
from tests.integration.test_pg_pool import _terminate

pytestmark = pytest.mark.postgres

pg = test_pg_pool.pg  # the store on a pool of two connections

TXID = select(literal_column("txid_current()", Integer))
BACKEND = select(literal_column("pg_backend_pid()", Integer))
SLEEP = select(func.count()).select_from(func.pg_sleep(bindparam("seconds", type_=Integer)))
PROBE = Table("driver_path_probe", MetaData(), Column("k", Integer, primary_key=True))


@pytest.fixture
def no_sqlalchemy_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    """``exec_driver_sql`` fails: a statement that still runs took the driver's path."""

    async def refused(self: AsyncConnection, *args: Any, **kw: Any) -> Any:
        raise AssertionError("went through SQLAlchemy's execution layer")

    monkeypatch.setattr(AsyncConnection, "exec_driver_sql", refused)


async def _one(conn: AsyncConnection, stmt: Any, **params: Any) -> Any:
    [(value,)] = await pg_driver.run_pg(conn, stmt, params)
    return value


@pytest.mark.usefixtures("no_sqlalchemy_execution")
async def test_statements_share_the_blocks_transaction_or_commit_alone(pg: Database) -> None:
    async with pg.transaction() as conn:
        first = await _one(conn, TXID)
        assert await _one(conn, TXID) == first
    async with pg.statement() as conn:  # autocommit: each statement a transaction
        first = await _one(conn, TXID)
        # a later transaction, not necessarily the next id: the ids are the cluster's, and
        # the other xdist workers' databases take some between the two statements
        assert await _one(conn, TXID) > first


@pytest.fixture
async def probe(pg: Database) -> AsyncIterator[Table]:
    """A table of the test's own, dropped after it."""
    async with pg.transaction() as conn:
        await conn.execute(text("CREATE TABLE driver_path_probe (k int PRIMARY KEY)"))
    yield PROBE
    async with pg.transaction() as conn:
        await conn.execute(text("DROP TABLE driver_path_probe"))


@pytest.mark.usefixtures("no_sqlalchemy_execution")
async def test_a_failed_statement_is_a_dbapi_error_and_the_block_rolls_back(
    pg: Database, probe: Table
) -> None:
    stmt = insert(probe).values(k=bindparam("k", type_=Integer))

    async def twice() -> None:
        async with pg.transaction() as conn:
            await pg_driver.run_pg(conn, stmt, {"k": 1})
            await pg_driver.run_pg(conn, stmt, {"k": 1})  # the same key again

    with pytest.raises(sa_exc.DBAPIError) as caught:
        await twice()
    assert isinstance(caught.value, sa_exc.IntegrityError)
    assert isinstance(caught.value.orig.__cause__, asyncpg.UniqueViolationError)  # type: ignore[union-attr]
    async with pg.read() as conn:  # the first insert rolled back with the block
        assert (await conn.execute(select(probe.c.k))).all() == []
        assert await _one(conn, TXID)  # and the connection went back to the pool usable


@pytest.mark.usefixtures("no_sqlalchemy_execution")
async def test_a_connection_the_server_closed_fails_once_then_the_pool_recovers(
    pg: Database, pg_url: str
) -> None:
    for opened in (pg.read, pg.statement):  # the two pools
        async with opened() as a, opened() as b:
            pids = {await _one(a, BACKEND), await _one(b, BACKEND)}
        for pid in pids:
            await _terminate(pg_url, pid)
        with pytest.raises(StoreUnavailable):
            async with opened() as conn:
                await _one(conn, BACKEND)
        for _ in range(3):  # the pool's older connection was replaced with the one that failed
            async with opened() as conn:
                assert await _one(conn, BACKEND) not in pids


@pytest.mark.usefixtures("no_sqlalchemy_execution")
async def test_a_statement_cancelled_halfway_leaves_no_busy_connection_in_the_pool(
    pg: Database,
) -> None:
    pid: int | None = None

    async def sleep() -> None:
        nonlocal pid
        async with pg.statement() as conn:
            pid = await _one(conn, BACKEND)
            await pg_driver.run_pg(conn, SLEEP, {"seconds": 1})

    task = asyncio.create_task(sleep())
    await asyncio.sleep(0.2)
    task.cancel()
    # the block's end finds the connection gone: StoreUnavailable, as through SQLAlchemy
    with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
        await task
    async with pg.statement() as a, pg.statement() as b:  # both of the pool's connections
        assert pid not in {await _one(a, BACKEND), await _one(b, BACKEND)}


async def test_a_listener_on_the_engines_statements_sees_them_all(pg: Database) -> None:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    for engine in pg.engines:
        event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        async with pg.transaction() as conn:
            await _one(conn, TXID)
        async with pg.statement() as conn:
            await _one(conn, TXID)
    finally:
        for engine in pg.engines:
            event.remove(engine.sync_engine, "before_cursor_execute", record)
    assert len([s for s in seen if "txid_current" in s]) == 2


@pytest.mark.usefixtures("no_sqlalchemy_execution")
async def test_an_insert_then_a_read_is_one_statement_and_notifies_once_found_or_not(
    pg: Database, probe: Table, pg_url: str
) -> None:
    """``bulk.insert_then_read``: the rows are written, the query reads the table as it was
    before them (one snapshot), and the ``NOTIFY`` goes out at commit, once, whether the
    query found rows or not."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(pg_url)
    await listener.add_listener("driver_path", lambda *a: heard.put_nowait(a[3]))
    above = (
        select(probe.c.k).where(probe.c.k > bindparam("floor", type_=Integer)).order_by(probe.c.k)
    )
    try:
        async with pg.transaction() as conn:
            written = driver.Insert(probe, [{"k": 1}, {"k": 2}], "driver_path", "first")
            assert await bulk.insert_then_read(conn, written, above, {"floor": 0}) == []
            written = driver.Insert(probe, [{"k": 3}], "driver_path", "second")
            found = await bulk.insert_then_read(conn, written, above, {"floor": 1})
            assert found == [(2,)]  # not 3: written by the same statement
            assert heard.empty()  # at commit
        async with asyncio.timeout(5):
            assert [await heard.get(), await heard.get()] == ["first", "second"]
        async with pg.transaction() as conn:  # without a channel: no NOTIFY
            written = driver.Insert(probe, [{"k": 4}])
            assert len(await bulk.insert_then_read(conn, written, above, {"floor": 0})) == 3
        async with pg.read() as conn:
            assert [k for (k,) in await pg_driver.run_pg(conn, above, {"floor": 0})] == [1, 2, 3, 4]
        await asyncio.sleep(0.2)
        assert heard.empty()
    finally:
        await listener.close()


async def test_a_string_too_long_for_its_column_is_refused_not_cut_short(pg: Database) -> None:
    """The arrays of an ``unnest`` insert or update are cast to their column's type without
    its length: PostgreSQL's cast to ``varchar(n)`` would cut a longer value short without a
    word, where the column refuses it (as a row-by-row insert did)."""
    short = Table(
        "driver_path_short",
        MetaData(),
        Column("k", Integer, primary_key=True),
        Column("v", String(4)),
    )
    async with pg.transaction() as conn:
        await conn.execute(text("CREATE TABLE driver_path_short (k int PRIMARY KEY, v varchar(4))"))
    try:
        writes = [
            lambda conn: bulk.insert(
                conn, short, [{"k": 5, "v": "fits"}, {"k": 6, "v": "too long"}]
            ),
            lambda conn: bulk.insert(
                conn, short, [{"k": 1, "v": "too long"}], update_on_conflict=("k",)
            ),
            lambda conn: bulk.update(conn, short, [({"v": "too long"}, {"k": 1})]),
            lambda conn: bulk.insert_then_read(
                conn, driver.Insert(short, [{"k": 3, "v": "too long"}]), select(short.c.k), {}
            ),
        ]
        async with pg.transaction() as conn:
            await bulk.insert(conn, short, [{"k": 1, "v": "fits"}])
        for write in writes:
            with pytest.raises(sa_exc.DBAPIError) as caught:
                async with pg.transaction() as conn:
                    await write(conn)
            assert isinstance(caught.value.orig.__cause__, asyncpg.StringDataRightTruncationError)  # type: ignore[union-attr]
        async with pg.read() as conn:
            assert (await conn.execute(select(short.c.k, short.c.v))).all() == [(1, "fits")]
    finally:
        async with pg.transaction() as conn:
            await conn.execute(text("DROP TABLE driver_path_short"))


async def test_a_new_connection_knows_the_array_types_of_every_column(
    pg: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncpg looks an array type up in ``pg_type`` the first time a connection uses it;
    the store's connections learn all of its columns' array types when they are made (one
    query), so a run's first claim and progress do not pay those lookups."""
    looked_up: list[set[int]] = []
    introspect = asyncpg.Connection._introspect_types  # type: ignore[attr-defined]

    async def spied(self: asyncpg.Connection, oids: Any, timeout: Any) -> Any:
        looked_up.append(set(oids))
        return await introspect(self, oids, timeout)

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", spied)
    async with pg.read() as conn:
        await conn.execute(text("SELECT 1"))
    assert looked_up, "the connection learned no array type when it was made"
    looked_up.clear()
    types = {
        pg_driver.pg_item_type(column.type).compile(dialect=postgresql.dialect()): column.type
        for table in metadata.tables.values()
        for column in table.columns
    }
    async with pg.read() as conn:
        for type_ in types.values():
            array = bindparam(
                "a", type_=postgresql.ARRAY(pg_driver.pg_item_type(type_), dimensions=1)
            )
            size = func.cardinality(array, type_=Integer)
            assert await _one(conn, select(size), a=[None]) == 1
    assert looked_up == [], sorted(types)


async def test_a_type_the_database_lacks_does_not_stop_a_connection(
    pg: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database not migrated yet may lack a type of the store's columns: its connections
    still open (they only learn fewer types), or it could never be migrated."""
    monkeypatch.setattr(db_module, "_array_types_query", lambda: "SELECT NULL::no_such_type[]")
    async with pg.read() as conn:
        assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
