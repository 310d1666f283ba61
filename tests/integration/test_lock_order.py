"""Lock order on PostgreSQL (issue 19, finding 1).

A worker's heartbeat (``extend_leases``) and its group writes (``apply_progress``) run at the
same time on different pool connections, over the same runs. The group write locks its rows
in ``run_id`` order; a heartbeat that locked them in the heap's order deadlocked with it, and
PostgreSQL killed one of the two. These tests lay the rows out in the heap in the opposite
order to ``run_id`` (inserted newest first), so a heartbeat that does not sort meets the group
write head on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from flowhook.clock import SystemClock
from flowhook.engine.worker import Worker
from flowhook.errors import WriteConflict
from flowhook.ids import new_id
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, Run, RunStatus, RunStep, StepStatus
from flowhook.store.tables import runs
from flowhook.store.wakeup import Wakeup
from tests.conftest import _truncate_all
from tests.support import secret_key_for

pytestmark = pytest.mark.postgres

OWNER = "worker-a"
RUNS = 300
ROUNDS = 15


@pytest.fixture
def empty_pg(pg_url: str) -> str:
    _truncate_all(pg_url)
    return pg_url


@pytest.fixture
async def pg(empty_pg: str) -> AsyncIterator[Database]:
    database = Database(empty_pg, secret_key=secret_key_for(empty_pg))
    yield database
    await database.dispose()


async def _leased(db: Database, n: int) -> list[str]:
    """``n`` running runs leased to ``OWNER``, stored in the heap in descending ``run_id``
    order; their ids ascending."""
    now = datetime.now(UTC)
    ids = sorted(new_id("run") for _ in range(n))
    batch = [
        (Run(r, "ws_a", Mode.TEST, "wf_x", 1, "api", RunStatus.QUEUED, {}, now), None, None)
        for r in reversed(ids)
    ]
    async with db.transaction() as conn:
        await runs_store.insert_runs(conn, batch)
    async with db.transaction() as conn:  # one pass in heap order: the order stays reversed
        await conn.execute(
            update(runs).values(
                status="running",
                lease_owner=OWNER,
                lease_expires_at=now + timedelta(seconds=30),
                available_at=now + timedelta(seconds=30),
            )
        )
    return ids


def _progress(run_id: str, k: int) -> runs_store.Progress:
    now = datetime.now(UTC)
    step = RunStep(k, f"s{k}", "transform", StepStatus.COMPLETED, 1, now, now, 0, {"k": k})
    return runs_store.Progress(
        run_id,
        (
            runs_store.StatusChange(
                RunStatus.RUNNING, {"steps_executed": k + 1, "next_step": k + 1}
            ),
        ),
        [step],
    )


async def test_heartbeats_and_group_writes_on_the_same_runs_never_deadlock(
    pg: Database,
) -> None:
    """The store's statements alone, without any retry: each side commits every round."""
    ids = await _leased(pg, RUNS)

    async def group_write(k: int) -> list[bool]:
        async with pg.transaction() as conn:
            return await runs_store.apply_progress(
                conn, [_progress(r, k) for r in ids], owner=OWNER
            )

    async def heartbeat() -> int:
        async with pg.transaction() as conn:
            return await runs_store.extend_leases(
                conn, owner=OWNER, run_ids=ids, until=datetime.now(UTC) + timedelta(seconds=30)
            )

    for k in range(ROUNDS):
        written, extended = await asyncio.gather(group_write(k), heartbeat())
        assert written == [True] * RUNS
        assert extended == RUNS


async def test_a_workers_heartbeat_and_commit_path_share_runs_without_conflicts(
    pg: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's own paths, as they run in production: progress through its group commit
    (batches of ``PROGRESS_BATCH``) while its heartbeat extends the same leases. Every write
    lands, and no transaction even had to be retried."""
    ids = await _leased(pg, RUNS)
    worker = Worker(pg, SystemClock(), Wakeup(), owner=OWNER, lease_seconds=30)
    caplog.set_level(logging.WARNING, logger="flowhook.store")
    for k in range(ROUNDS):
        writes = [worker._writes.submit(_progress(r, k)) for r in ids]
        *written, extended = await asyncio.gather(*writes, worker.beat(list(reversed(ids))))
        assert written == [True] * RUNS
        assert extended == RUNS
    assert [r.getMessage() for r in caplog.records if "lock conflict" in r.getMessage()] == []
    async with pg.read() as conn:
        run = await runs_store.get_run_by_id(conn, ids[0])
    assert run is not None and run.steps_executed == ROUNDS and len(run.steps) == ROUNDS


async def _cross(db: Database, first: str, second: str, both_hold: asyncio.Barrier) -> None:
    """Lock ``first`` then ``second``; on its first try, only after the other side holds its
    own first row, so two of these in opposite orders deadlock."""
    tried = False

    async def work(conn: object) -> None:
        nonlocal tried
        for n, run_id in enumerate((first, second)):
            await conn.execute(  # type: ignore[attr-defined]
                update(runs).where(runs.c.run_id == run_id).values(claims=runs.c.claims + 1)
            )
            if n == 0 and not tried:
                tried = True
                await both_hold.wait()

    await db.retrying(work)


async def test_a_deadlock_is_a_write_conflict_and_is_retried(pg: Database) -> None:
    """A real deadlock (40P01) comes out of the store as WriteConflict, and ``retrying`` runs
    the losing transaction again: both sides commit, the loser's first try wrote nothing."""
    a, b = await _leased(pg, 2)
    barrier = asyncio.Barrier(2)
    await asyncio.gather(_cross(pg, a, b, barrier), _cross(pg, b, a, barrier))
    async with pg.read() as conn:
        claims = [(await runs_store.get_run_by_id(conn, r)) for r in (a, b)]
    assert [c.claims if c else None for c in claims] == [2, 2]

    barrier = asyncio.Barrier(2)

    async def once(first: str, second: str) -> None:
        async with pg.transaction() as conn:
            await conn.execute(update(runs).where(runs.c.run_id == first).values(claims=0))
            await barrier.wait()
            await conn.execute(update(runs).where(runs.c.run_id == second).values(claims=0))

    results = await asyncio.gather(once(a, b), once(b, a), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["NoneType", WriteConflict.__name__]
