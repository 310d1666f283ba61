"""PostgreSQL's pool: a connection that sat idle is pinged before use and replaced if the
server closed it; one in steady use is not pinged (asyncpg's ping is three round trips), and
if the server closed it, its first use fails as ``StoreUnavailable`` once and the pool then
replaces every connection made before. A block of one write statement runs in autocommit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

from flowhook.errors import StoreUnavailable
from flowhook.store import db as db_module
from flowhook.store.db import Database
from tests.conftest import TEST_SECRET_KEY

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg(pg_url: str) -> AsyncIterator[Database]:
    database = Database(pg_url, secret_key=TEST_SECRET_KEY, pool_size=2)
    yield database
    await database.dispose()


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the pings of the asyncpg connections."""
    made: list[int] = []
    ping = AsyncAdapt_asyncpg_connection.ping

    def counted(self: Any) -> Any:
        made.append(1)
        return ping(self)

    monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "ping", counted)
    return made


async def _backend(db: Database) -> int:
    async with db.read() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def _two_backends(db: Database) -> tuple[int, int]:
    """The server processes of two connections of the pool, both held at once."""
    async with db.read() as a, db.read() as b:
        one = (await a.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        two = (await b.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    return int(one), int(two)


async def _terminate(pg_url: str, pid: int) -> None:
    admin = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    await asyncio.sleep(0.05)  # the server closes the socket


async def test_a_connection_in_steady_use_is_not_pinged(pg: Database, pings: list[int]) -> None:
    first = await _backend(pg)
    for _ in range(20):
        assert await _backend(pg) == first  # the last one returned is taken again (LIFO)
    assert pings == []


async def test_an_idle_connection_the_server_closed_is_replaced_before_use(
    pg: Database, pg_url: str, pings: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await _backend(pg)
    await _terminate(pg_url, first)
    monkeypatch.setattr(db_module, "IDLE_PING", 0.0)  # it has sat idle long enough
    again = await _backend(pg)
    assert again != first
    assert pings  # found dead by the ping, not by a failed statement


async def test_a_warm_connection_the_server_closed_fails_once_then_the_pool_recovers(
    pg: Database, pg_url: str, pings: list[int]
) -> None:
    one, two = await _two_backends(pg)
    await _terminate(pg_url, one)
    await _terminate(pg_url, two)
    with pytest.raises(StoreUnavailable):
        await _backend(pg)
    # The failure replaced the pool's older connections too: no second failure.
    fresh = {await _backend(pg) for _ in range(3)}
    assert not fresh & {one, two}
    assert pings == []


async def test_a_failed_ping_replaces_the_older_connections_too(
    pg: Database, pg_url: str, pings: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``pool_pre_ping`` did: once a ping finds the server closed one connection, the
    others made before it are replaced too, so a warm one (not pinged) does not fail after."""

    one, two = await _two_backends(pg)
    await _terminate(pg_url, one)
    await _terminate(pg_url, two)
    monkeypatch.setattr(db_module, "IDLE_PING", 0.0)
    await _backend(pg)  # pinged, found closed: the pool is renewed
    assert pings
    monkeypatch.setattr(db_module, "IDLE_PING", 3600.0)  # no more pings from here
    assert not set(await _two_backends(pg)) & {one, two}


async def _transaction_ids(conn: Any) -> tuple[int, int]:
    first = (await conn.execute(text("SELECT txid_current()"))).scalar_one()
    second = (await conn.execute(text("SELECT txid_current()"))).scalar_one()
    return int(first), int(second)


async def test_a_single_statement_block_is_its_own_transaction(pg: Database) -> None:
    """``statement()`` (the run claim's) sends no ``BEGIN`` and ``COMMIT`` on PostgreSQL: each
    statement in it commits alone, where ``transaction()``'s share one transaction."""
    async with pg.statement() as conn:
        first, second = await _transaction_ids(conn)
    # each its own transaction (ids are the cluster's: other databases' work, another xdist
    # worker's, may take the ids between)
    assert second > first
    async with pg.transaction() as conn:
        first, second = await _transaction_ids(conn)
    assert second == first


async def test_a_single_statement_block_wakes_after_it(pg: Database) -> None:
    runs = pg.wakeups["runs"]
    runs.clear()
    async with pg.statement() as conn:
        conn.info["wake"].add("runs")
        assert not await runs.wait(0)
    assert await runs.wait(0)
    async with pg.statement() as conn:
        assert "wake" in conn.info  # its own set: the last block's is gone with it
        assert not conn.info["wake"]
