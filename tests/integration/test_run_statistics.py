"""PostgreSQL plans the accept path with statistics of ``runs`` (issue 19, finding 2).

Without them the Idempotency-Key lookup used the ``(workspace_id, mode, run_id)`` index and
read every run of the workspace on each accept; after a PostgreSQL restart the backlog of
requests never drained. Accepting runs now makes sure the table has been analyzed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from flowhook.clock import SystemClock
from flowhook.config import Settings
from flowhook.ids import pack_id
from flowhook.service import Services
from flowhook.service.runs import STATISTICS_AFTER
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.wakeup import Wakeup
from tests.support import TEST_SECRET_KEY

FLOW: dict[str, Any] = {
    "name": "s",
    "steps": [{"id": "a", "type": "transform", "output": {"x": "{{ payload.x }}"}}],
}
LOOKUP = "SELECT run_id FROM runs WHERE workspace_id = $1 AND mode = $2 AND idempotency_key = $3"


@pytest.fixture
async def fresh_pg(pg_url: str) -> AsyncIterator[str]:
    """A new migrated database whose ``runs`` autovacuum leaves alone, so that only
    flowhook can give it statistics while the test runs."""
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
    finally:
        await conn.close()
    yield url
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _has_statistics(conn: Any) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stats"
            " WHERE schemaname = current_schema() AND tablename = 'runs'"
        )
    )


async def _lookup_plan(conn: Any, workspace_id: str) -> str:
    """The generic plan of the Idempotency-Key lookup (what a prepared statement keeps)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        rows = await conn.fetch(f"EXPLAIN {LOOKUP}", pack_id(workspace_id), "test", "k")
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
        assert not await _has_statistics(conn)

        for i in range(STATISTICS_AFTER):
            await services.runs.start(
                who, flow_id=flow.flow_id, payload={"x": i}, idempotency_key=f"key-{i}"
            )
        gathering = getattr(services.runs, "_statistics", None)
        if gathering is not None:
            await asyncio.wait_for(gathering, 30)

        assert await _has_statistics(conn)
        plan = await _lookup_plan(conn, who.workspace_id)
        assert "uq_runs_workspace_id_mode_idempotency_key" in plan, plan
        assert await db.gather_statistics(("runs",)) == []  # once is enough
    finally:
        await conn.close()
        await db.dispose()


async def test_gathering_statistics_does_nothing_on_sqlite(tmp_path: Any) -> None:
    db = Database(f"sqlite:///{tmp_path / 'f.db'}")
    try:
        assert await db.gather_statistics(("runs",)) == []
    finally:
        await db.dispose()
