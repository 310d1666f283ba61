"""The delivery claim's statements are built once and reused with new values (on SQLite run
straight on ``sqlite3``): whatever shape ran first, each claim still honours its own busy
endpoints, per-endpoint cap and limit, and the due-time probe its own busy endpoints."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from flowhook.clock import FakeClock
from flowhook.service import Services
from flowhook.store import delivery_queue, sqlite_driver
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import DeliveryStatus, Mode
from flowhook.store.tables import deliveries
from tests.integration.test_dispatcher import raise_event, setup

LEASE = timedelta(seconds=30)


async def _claim(
    db: Database, clock: FakeClock, *, limit: int, per_endpoint: int, busy: list[str]
) -> list[delivery_queue.DueDelivery]:
    now = clock.now()
    async with db.transaction() as conn:
        return await delivery_queue.claim_deliveries(
            conn,
            owner="d",
            now=now,
            lease_until=now + LEASE,
            limit=limit,
            per_endpoint=per_endpoint,
            busy_endpoints=busy,
        )


async def _next_due(db: Database, busy: list[str]) -> object:
    async with db.read() as conn:
        return await delivery_queue.next_due_delivery(conn, busy)


async def test_claims_of_every_shape_honour_their_own_caps_and_busy_endpoints(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who, (a, b, c) = await setup(services, clock, [f"http://127.0.0.1:9/{n}" for n in "abc"])
    await raise_event(db, who, clock, n=4)  # 4 deliveries to each endpoint, all due now
    clock.advance(1)

    # Warm the statements with no busy endpoint and a small cap.
    first = await _claim(db, clock, limit=2, per_endpoint=1, busy=[])
    assert len(first) == 2 and len({d.endpoint_id for d in first}) == 2
    assert all(d.attempts == 1 and d.body and d.url for d in first)

    # Two busy endpoints (a list of another length), a larger cap: only c, at most 2.
    second = await _claim(db, clock, limit=8, per_endpoint=2, busy=[a, b])
    assert Counter(d.endpoint_id for d in second) == {c: 2}

    # One busy endpoint, cap 1: one each of a and b.
    third = await _claim(db, clock, limit=8, per_endpoint=1, busy=[c])
    assert Counter(d.endpoint_id for d in third) == {a: 1, b: 1}

    # And with no busy endpoint again, the limit holds: 12 - 6 left, 5 taken.
    fourth = await _claim(db, clock, limit=5, per_endpoint=8, busy=[])
    assert len(fourth) == 5
    taken = [d.id for d in first + second + third + fourth]
    assert len(set(taken)) == len(taken) == 11  # never the same delivery twice

    # The due-time probe: one delivery is left (due at t=0), unless its endpoint is busy.
    left = {a: 4, b: 4, c: 4}
    for d in first + second + third + fourth:
        left[d.endpoint_id] -= 1
    [last] = [ep for ep, n in left.items() if n]
    others = [ep for ep in (a, b, c) if ep != last]
    due = clock.now() - timedelta(seconds=1)
    assert await _next_due(db, []) == due
    assert await _next_due(db, others) == due
    assert await _next_due(db, [last]) == clock.now() + LEASE  # the leases' ends
    assert await _next_due(db, [a, b, c]) is None


async def test_a_claim_takes_only_deliveries_still_due(services: Services, db: Database) -> None:
    """The claim's UPDATE keeps its guard with bound values: a delivery whose lease another
    claim holds is not taken again before the lease ends, and is once it has."""
    clock = FakeClock()
    who, _ = await setup(services, clock, ["http://127.0.0.1:9/"])
    await raise_event(db, who, clock, n=2)
    [one] = await _claim(db, clock, limit=1, per_endpoint=8, busy=[])
    [two] = await _claim(db, clock, limit=8, per_endpoint=8, busy=[])
    assert one.id != two.id
    assert await _claim(db, clock, limit=8, per_endpoint=8, busy=[]) == []
    clock.advance(LEASE.total_seconds() + 1)
    again = await _claim(db, clock, limit=8, per_endpoint=8, busy=[])
    assert sorted((d.id, d.attempts) for d in again) == sorted([(one.id, 2), (two.id, 2)])


async def test_a_claim_reads_what_each_attempt_needs(services: Services, db: Database) -> None:
    """What a claim reads back (on SQLite from ``sqlite3`` itself, its text turned into
    typed values): the signed body, both secrets with the previous one's expiry, the
    timestamps as aware UTC datetimes; and for a deleted endpoint, no URL."""
    clock = FakeClock()
    who, (kept, gone) = await setup(
        services, clock, ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]
    )
    rotated = await services.webhooks.rotate_secret(who, kept)
    await raise_event(db, who, clock)
    await services.webhooks.delete_endpoint(who, gone)
    claimed = {d.endpoint_id: d for d in await _claim(db, clock, limit=8, per_endpoint=8, busy=[])}
    mine, orphan = claimed[kept], claimed[gone]
    assert (mine.url, mine.enabled, mine.secret) == ("http://127.0.0.1:9/a", True, rotated.secret)
    assert mine.previous_secret and mine.previous_secret != mine.secret
    assert mine.previous_secret_expires_at == rotated.previous_secret_expires_at
    assert mine.created_at == clock.now() and mine.created_at.tzinfo is not None
    assert mine.failing_since is None and mine.attempts == 1
    body = orjson.loads(mine.body)
    assert (body["event"], body["run_id"], body["payload"]) == ("flow.completed", "run_0", {"i": 0})
    assert (orphan.url, orphan.enabled, orphan.secret, orphan.body) == (None, False, "", mine.body)


async def test_the_run_queues_due_time_probe(services: Services, db: Database) -> None:
    """The worker's probe (built once, on SQLite read straight from ``sqlite3``): nothing
    queued, a queued run's time, then its lease's end once claimed, as aware datetimes."""
    clock = FakeClock()
    created = await services.keys.create(Mode.TEST, "ws")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    services.runs._clock = clock  # type: ignore[attr-defined]

    async def due() -> object:
        async with db.read() as conn:
            return await runs_store.next_due(conn)

    assert await due() is None
    flow = await services.flows.create(
        who, {"name": "t", "steps": [{"id": "a", "type": "transform", "output": {}}]}
    )
    started = await services.runs.start(who, flow_id=flow.flow_id, payload={})
    assert await due() == clock.now()
    clock.advance(1)
    now = clock.now()
    async with db.transaction() as conn:
        [run] = await runs_store.claim_runs(
            conn, owner="w", now=now, lease_until=now + LEASE, limit=4
        )
    assert run.run_id == started.run.run_id
    assert await due() == now + LEASE


@pytest.fixture(params=["slice", "past"])
def probe_stage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The probe's answer from its first stage (the earliest pending deliveries hold one of
    another endpoint) or its second (a slice of one: every time only busy ones)."""
    if request.param == "past":
        monkeypatch.setattr(delivery_queue, "NEXT_DUE_SLICE", 1)
    delivery_queue._next_due_statement.cache_clear()
    yield request.param
    monkeypatch.undo()
    delivery_queue._next_due_statement.cache_clear()


async def test_the_due_time_probe_looks_past_a_busy_endpoints_backlog(
    services: Services, db: Database, probe_stage: str
) -> None:
    """Past the busy endpoints, the probe finds the earliest pending delivery of the others
    however many the busy ones have due before it, and leaves out finished ones; and a claim
    with nothing due past its busy endpoints takes nothing."""
    clock = FakeClock()
    who, (a, b, c) = await setup(services, clock, [f"http://127.0.0.1:9/{n}" for n in "abc"])
    await raise_event(db, who, clock, n=30)  # 30 due to each endpoint at t0
    t0 = clock.now()
    clock.advance(5)
    # c's all claimed (leased until t5 + LEASE), b's all succeeded: a's backlog comes first.
    for d in await _claim(db, clock, limit=64, per_endpoint=64, busy=[a, b]):
        assert d.endpoint_id == c
    async with db.transaction() as conn:
        await conn.execute(
            deliveries.update()
            .where(deliveries.c.endpoint_id == b)
            .values(status=DeliveryStatus.SUCCEEDED.value, finished_at=clock.now())
        )
    assert await _next_due(db, []) == t0
    assert await _next_due(db, [a]) == clock.now() + LEASE  # c's leases' end
    assert await _next_due(db, [c]) == t0
    assert await _next_due(db, [a, c]) is None  # b has only succeeded ones
    assert await _claim(db, clock, limit=8, per_endpoint=8, busy=[a]) == []
    assert len(await _claim(db, clock, limit=8, per_endpoint=8, busy=[c])) == 8


async def _sqlite_plan(tmp_path: Path, stmt: Any) -> list[str]:
    """SQLite's ``EXPLAIN QUERY PLAN`` of ``stmt`` on a migrated, empty database (a list
    parameter bound to one value, every other to a placeholder value)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    db = Database(f"sqlite:///{tmp_path / 'plan.db'}")
    await migrate(db)
    try:
        async with db.read() as conn:
            inline = sqlite_driver.inline_sqlite(conn)
            assert inline is not None
            compiled = stmt.compile(dialect=conn.dialect)
            sql = re.sub(r"\(__\[POSTCOMPILE_\w+\]\)", "(?)", str(compiled))
            values = [
                1 if compiled.params.get(n) is None else compiled.params[n]
                for n in compiled.positiontup or ()
            ]
            return [row[3] for row in inline.raw.execute("EXPLAIN QUERY PLAN " + sql, values)]
    finally:
        await db.dispose()


async def test_the_due_time_probe_past_busy_endpoints_reads_its_own_index(
    tmp_path: Path,
) -> None:
    """On SQLite every read of the probe past busy endpoints is a search of the partial index
    of pending deliveries by endpoint: one seek per endpoint, not a walk of a backlog or of
    delivered rows (which the (endpoint_id, status, created_at) index would be). PostgreSQL
    plans for itself; the results of the test above hold on both."""
    plan = await _sqlite_plan(tmp_path, delivery_queue._next_due_past_statement())
    reads = [step for step in plan if "deliveries" in step]
    assert len(reads) == 3, plan
    assert all("USING INDEX ix_deliveries_endpoint_due" in step for step in reads), plan


async def test_the_claims_read_their_partial_indexes_in_order(tmp_path: Path) -> None:
    """SQLite picks the indexes the claims are written for (SQLAlchemy renders no ``INDEXED
    BY`` hint for it, so nothing forces them): the delivery window reads pending deliveries
    by ``due_at``; the run claim's skip scan seeks from one workspace to the next in
    ``ix_runs_queue``, and each queue's due runs are read from it in three ranges (priority
    above 0, 0 up to now, below 0), so no read walks a backlog or a queue's sleeping runs."""
    window = await _sqlite_plan(tmp_path / "w", delivery_queue._oldest_due_statement(True))
    assert [s for s in window if "deliveries" in s] == [
        "SEARCH deliveries USING INDEX ix_deliveries_due_at (due_at<?)"
    ], window
    spaces = await _sqlite_plan(tmp_path / "s", runs_store._spaces_statement())
    reads = [s.removeprefix("SEARCH runs USING INDEX ix_runs_queue ") for s in spaces]
    assert [s for s in reads if s.startswith("(")] == [
        "(workspace_id>?)",  # from the last turn's workspace up: the first…
        "(workspace_id>?)",  # …and the next after each
        "(workspace_id=? AND mode=?)",  # whether it has live runs
        "(workspace_id=? AND mode=?)",  # and test runs
        "(workspace_id<?)",  # then from the lowest workspace…
        "(workspace_id>? AND workspace_id<?)",  # …up to the last turn's
        "(workspace_id=? AND mode=?)",
        "(workspace_id=? AND mode=?)",
    ], spaces
    claim = await _sqlite_plan(tmp_path / "r", runs_store._claim_statement(False, 2))
    reads = [s for s in claim if s.startswith("SEARCH runs USING INDEX")]
    queue = "SEARCH runs USING INDEX ix_runs_queue (workspace_id=? AND mode=? AND "
    assert reads == 2 * [
        f"{queue}priority>?)",
        f"{queue}priority=? AND due_at<?)",
        f"{queue}priority<?)",
    ], claim


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # rows lock there
async def test_concurrent_claims_take_each_delivery_once_without_deadlock(
    services: Services, db: Database
) -> None:
    """Six claimers at once take every delivery exactly once, and none fails. Claims lock
    their rows in id order; a review found claims that locked them in the order of the
    planner's scan deadlocking (40P01, a WriteConflict here) with a table of 100,000
    finished deliveries, which this test's smaller table did not reproduce."""
    assert db.dialect == "postgresql"
    clock = FakeClock()
    who, _ = await setup(services, clock, [f"http://127.0.0.1:9/{n}" for n in "abcd"])
    await raise_event(db, who, clock, n=1000)  # 4,000 deliveries, all due
    async with db.statement() as conn:  # fresh statistics, as a busy table has
        await conn.exec_driver_sql("ANALYZE deliveries")
    clock.advance(1)
    now = clock.now()

    async def claimer(owner: str) -> list[str]:
        mine: list[str] = []
        for _ in range(100):  # a bound: 64 a claim
            async with db.statement() as conn:
                got = await delivery_queue.claim_deliveries(
                    conn, owner=owner, now=now, lease_until=now + LEASE, limit=64,
                    per_endpoint=32,
                )  # fmt: skip
            if not got:
                break
            mine.extend(d.id for d in got)
        return mine

    taken = [i for ids in await asyncio.gather(*(claimer(f"d{n}") for n in range(6))) for i in ids]
    assert len(taken) == len(set(taken)) == 4000
