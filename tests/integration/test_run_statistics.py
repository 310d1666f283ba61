"""PostgreSQL plans the accept path with statistics of ``runs`` (issue 19, finding 2), and
the delivery claim with statistics of ``deliveries`` (issue 18).

Without them the Idempotency-Key lookup used the ``(workspace_id, mode, run_id)`` index and
read every run of the workspace on each accept; after a PostgreSQL restart the backlog of
requests never drained. Accepting runs now makes sure the table has been analyzed. The
delivery claim's guarded ``UPDATE`` read every due delivery (a bitmap scan of the due index)
instead of the claimed ones by their key; claiming a backlog now does the same for
``deliveries``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from flowhook.clock import SystemClock
from flowhook.config import Settings
from flowhook.events import make_event
from flowhook.ids import pack_id
from flowhook.service import Services
from flowhook.store import events as events_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.statistics import FIRST_AFTER, StatisticsKeeper
from flowhook.store.wakeup import Wakeup
from flowhook.webhooks import dispatcher as dispatching
from tests.conftest import Receiver
from tests.support import TEST_SECRET_KEY

FLOW: dict[str, Any] = {
    "name": "s",
    "steps": [{"id": "a", "type": "transform", "output": {"x": "{{ payload.x }}"}}],
}
LOOKUP = str(runs_store._by_idempotency_keys("postgresql").compile(dialect=asyncpg_dialect()))
"""The store's Idempotency-Key lookup as asyncpg prepares it: workspace, mode, keys."""


@pytest.fixture
async def fresh_pg(pg_url: str) -> AsyncIterator[str]:
    """A new migrated database whose ``runs`` and ``deliveries`` autovacuum leaves alone,
    so that only flowhook can give them statistics while the test runs."""
    name = f"flowhook_stats_{uuid.uuid4().hex[:10]}"
    pg_url = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = f"{pg_url.rpartition('/')[0]}/{name}"
    db = Database(url, secret_key=TEST_SECRET_KEY)
    await migrate(db)
    await db.dispose()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("ALTER TABLE runs SET (autovacuum_enabled = off)")
        await conn.execute("ALTER TABLE deliveries SET (autovacuum_enabled = off)")
    finally:
        await conn.close()
    yield url
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _has_statistics(conn: Any, table: str = "runs") -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() AND tablename = $1",
            table,
        )
    )


async def _lookup_plan(conn: Any, workspace_id: str) -> str:
    """The generic plan of the Idempotency-Key lookup (what a prepared statement keeps)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        rows = await conn.fetch(f"EXPLAIN {LOOKUP}", pack_id(workspace_id), "test", ["k"])
    return "\n".join(r[0] for r in rows)


@pytest.mark.postgres
async def test_accepting_runs_gathers_the_statistics_the_idempotency_lookup_needs(
    fresh_pg: str,
) -> None:
    db = Database(fresh_pg, secret_key=TEST_SECRET_KEY)
    settings = Settings(database_url=fresh_pg, secret_key=TEST_SECRET_KEY)
    services = Services(db, SystemClock(), settings, Wakeup())
    conn = await asyncpg.connect(fresh_pg)
    try:
        created = await services.keys.create(Mode.TEST, "ws")
        who = await services.keys.authenticate(f"Bearer {created.key}")
        flow = await services.flows.create(who, FLOW)
        # A database that took load before anything analyzed it.
        await conn.execute(
            "INSERT INTO runs (run_id, workspace_id, mode, flow_id, flow_version, trigger,"
            " status, payload, queued_at, available_at, due_at, idempotency_key, request_hash)"
            " SELECT '\\x00'::bytea || convert_to('run_old' || i, 'UTF8'), $1, 'test', $2, 1, 'api', 'completed',"
            " '{}', now(),"
            " now(), now(), md5(i::text), md5(i::text) FROM generate_series(1, 5000) i",
            pack_id(who.workspace_id),  # ids as the store keeps them
            pack_id(flow.flow_id),
        )
        # Counted before the gathering below: a backend reports its counts up to seconds
        # late, and 5,000 rows reported after it would make the statistics stale at once.
        await _changes_counted(conn, "runs", 5000)
        assert not await _has_statistics(conn)

        for i in range(FIRST_AFTER):
            await services.runs.start(
                who, flow_id=flow.flow_id, payload={"x": i}, idempotency_key=f"key-{i}"
            )
        gathering = services.runs.statistics.task
        assert gathering is not None
        await asyncio.wait_for(gathering, 30)

        assert await _has_statistics(conn)
        plan = await _lookup_plan(conn, who.workspace_id)
        assert "uq_runs_workspace_id_mode_idempotency_key" in plan, plan
        assert await db.gather_statistics(("runs",)) == []  # once is enough
    finally:
        await conn.close()
        await db.dispose()


@pytest.mark.postgres
async def test_claiming_a_delivery_backlog_gathers_the_statistics_the_claim_needs(
    fresh_pg: str, receiver: Receiver
) -> None:
    db = Database(fresh_pg, secret_key=TEST_SECRET_KEY)
    settings = Settings(
        database_url=fresh_pg, secret_key=TEST_SECRET_KEY, allow_private_targets=True
    )
    clock = SystemClock()
    services = Services(db, clock, settings, Wakeup())
    conn = await asyncpg.connect(fresh_pg)
    d = dispatching.Dispatcher(db, clock, Wakeup(), owner="d1", allow_private_targets=True)
    try:
        created = await services.keys.create(Mode.TEST, "ws")
        who = await services.keys.authenticate(f"Bearer {created.key}")
        for n in range(4):  # a claim takes at most HOLD * per_endpoint of one endpoint
            await services.webhooks.create_endpoint(
                who, url=f"{receiver.url}/{n}", events=["flow.completed"]
            )
        async with db.transaction() as tx:  # a backlog: 4 deliveries an event
            await events_store.insert_events(
                tx,
                [
                    make_event(
                        "flow.completed", workspace_id=who.workspace_id, mode=who.mode,
                        flow_id="wf_x", run_id=f"run_{i}", payload={"i": i}, now=clock.now(),
                    )
                    for i in range(500)
                ],
            )  # fmt: skip
        assert not await _has_statistics(conn, "deliveries")

        await d.open()
        claimed = 0
        for _ in range(20):  # a bound: 64 a claim, so two or three claims
            claimed += await d.run_once()
            await d.drain()
            if claimed >= FIRST_AFTER:
                break
        assert claimed >= FIRST_AFTER
        assert d.statistics.task is not None
        await asyncio.wait_for(d.statistics.task, 30)

        assert await _has_statistics(conn, "deliveries")
    finally:
        await d.stop()
        await conn.close()
        await db.dispose()


COMPLETION_READ = "SELECT id FROM deliveries WHERE id = ANY($1::bytea[]) AND status = 'pending'"
"""What a delivery completion reads: a few deliveries by their key."""


async def _generic_plan(conn: Any, query: str, *args: Any) -> str:
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        rows = await conn.fetch(f"EXPLAIN {query}", *args)
    return "\n".join(r[0] for r in rows)


async def _queue(db: Database, who: Any, first: int, count: int) -> None:
    """``count`` events, a delivery each to every endpoint."""
    async with db.transaction() as tx:
        await events_store.insert_events(
            tx,
            [
                make_event(
                    "flow.completed", workspace_id=who.workspace_id, mode=who.mode,
                    flow_id="wf_x", run_id=f"run_{i}", payload={"i": i}, now=SystemClock().now(),
                )
                for i in range(first, first + count)
            ],
        )  # fmt: skip


async def _changes_counted(conn: Any, table: str, at_least: int) -> None:
    """Wait until PostgreSQL's activity statistics show ``at_least`` changed rows of
        ``table`` since its last analyze. A PostgreSQL 15 backend that reported its counts less
    than a second ago reports new ones at its next statement a second later, or after 10 s
    idle, so they can show up to 10 s late."""
    query = "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = $1"
    for _ in range(300):
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        if (await conn.fetchval(query, table) or 0) >= at_least:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{table}: fewer than {at_least} changes counted after 30 s")


@pytest.mark.postgres
async def test_statistics_are_gathered_again_once_a_table_outgrows_them(
    fresh_pg: str, receiver: Receiver
) -> None:
    """A generic plan made while ``deliveries`` was small read the whole table for every
    completion once it had grown (issue 18): statistics gathered again make the plan new."""
    db = Database(fresh_pg, secret_key=TEST_SECRET_KEY)
    settings = Settings(
        database_url=fresh_pg, secret_key=TEST_SECRET_KEY, allow_private_targets=True
    )
    services = Services(db, SystemClock(), settings, Wakeup())
    conn = await asyncpg.connect(fresh_pg)
    try:
        created = await services.keys.create(Mode.TEST, "ws")
        who = await services.keys.authenticate(f"Bearer {created.key}")
        for n in range(4):
            await services.webhooks.create_endpoint(
                who, url=f"{receiver.url}/{n}", events=["flow.completed"]
            )
        await _queue(db, who, 0, 25)
        assert await db.gather_statistics(("deliveries",)) == ["deliveries"]
        some = [pack_id(f"dlv_{i}") for i in range(8)]
        assert "Seq Scan" in await _generic_plan(conn, COMPLETION_READ, some)

        await _queue(db, who, 25, 1500)
        await _changes_counted(conn, "deliveries", 6000)
        assert await db.gather_statistics(("deliveries",)) == ["deliveries"]
        assert await db.gather_statistics(("deliveries",)) == []  # fresh: left alone
        assert "Index Scan using pk_deliveries" in await _generic_plan(conn, COMPLETION_READ, some)
    finally:
        await conn.close()
        await db.dispose()


@pytest.mark.postgres
async def test_a_keeper_looks_at_a_hundred_rows_written_then_at_each_tenfold(
    fresh_pg: str,
) -> None:
    db = Database(fresh_pg, secret_key=TEST_SECRET_KEY)
    keeper = StatisticsKeeper(db, ("runs",))
    try:
        keeper.wrote(FIRST_AFTER - 1)
        assert keeper.task is None
        keeper.wrote(1)
        first = keeper.task
        assert first is not None
        await asyncio.wait_for(first, 30)
        keeper.wrote(10 * FIRST_AFTER - FIRST_AFTER - 1)
        assert keeper.task is first
        keeper.wrote(1)
        assert keeper.task is not first and keeper.task is not None
        await asyncio.wait_for(keeper.task, 30)
        second = keeper.task
        keeper.wrote(1000 * FIRST_AFTER)  # past two thresholds at once: one look
        assert keeper.task is not second and keeper.task is not None
        third = keeper.task
        keeper.wrote(1)  # the next threshold is now 10,000 × FIRST_AFTER
        assert keeper.task is third
        await asyncio.wait_for(third, 30)
    finally:
        keeper.cancel()
        await db.dispose()


async def test_a_keeper_does_nothing_on_sqlite(tmp_path: Any) -> None:
    db = Database(f"sqlite:///{tmp_path / 'f.db'}")
    keeper = StatisticsKeeper(db, ("runs",))
    try:
        keeper.wrote(100 * FIRST_AFTER)
        assert keeper.task is None
    finally:
        await db.dispose()


async def test_gathering_statistics_does_nothing_on_sqlite(tmp_path: Any) -> None:
    db = Database(f"sqlite:///{tmp_path / 'f.db'}")
    try:
        assert await db.gather_statistics(("runs",)) == []
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_a_failed_gathering_is_logged_and_never_raises(
    fresh_pg: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = Database(fresh_pg, secret_key=TEST_SECRET_KEY)
    try:
        assert await db.gather_statistics(("no_such_table",)) == []
        assert "could not gather statistics of no_such_table" in caplog.text
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_gathering_on_an_unreachable_database_says_to_try_again() -> None:
    db = Database("postgresql://postgres@127.0.0.1:1/none", secret_key=TEST_SECRET_KEY)
    try:
        assert await db.gather_statistics(("runs",)) is None
    finally:
        await db.dispose()
