"""Per-key rate limit (429 with Retry-After) and retention pruning."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from flowhook.app import create_app
from flowhook.clock import FakeClock
from flowhook.config import Settings
from flowhook.engine.worker import Worker
from flowhook.service import Services
from flowhook.store import hooks as hooks_store
from flowhook.store.db import Database
from flowhook.store.models import Mode


async def test_per_key_rate_limit(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"rate_limit": 2.0}), run_worker=False)
    async with app.router.lifespan_context(app):
        key = (await app.state.services.keys.create(Mode.TEST, "w")).key
        other = (await app.state.services.keys.create(Mode.TEST, "w")).key
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            codes = [
                (
                    await c.get("/api/v1/flows", headers={"Authorization": f"Bearer {key}"})
                ).status_code
                for _ in range(8)
            ]
            assert codes[:4] == [200] * 4 and 429 in codes
            r = await c.get("/api/v1/flows", headers={"Authorization": f"Bearer {key}"})
            assert (
                r.status_code == 429
                and r.json()["code"] == "rate_limited"
                and int(r.headers["retry-after"]) >= 1
            )
            assert (
                await c.get("/api/v1/flows", headers={"Authorization": f"Bearer {other}"})
            ).status_code == 200


async def test_retention_prunes_old_finished_runs_with_their_history(
    services: Services, db: Database
) -> None:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    for s in (services.runs, services.retention, services.webhooks):
        s._clock = clock  # type: ignore[attr-defined]
    key = await services.keys.create(Mode.TEST, "w")
    who = await services.keys.authenticate(f"Bearer {key.key}")
    await services.webhooks.create_endpoint(
        who, url="https://8.8.8.8/hook", events=["flow.completed"]
    )
    flow = await services.flows.create(
        who, {"name": "r", "steps": [{"id": "a", "type": "transform", "output": {}}]}
    )
    old = (await services.runs.start(who, flow_id=flow.flow_id, payload={})).run.run_id
    worker = Worker(db, clock, services.wakeup)
    await worker.run_once()
    await worker.drain()
    clock.advance(31 * 86400)
    new = (await services.runs.start(who, flow_id=flow.flow_id, payload={})).run.run_id
    await worker.run_once()
    await worker.drain()
    async with db.transaction() as conn:  # as an inbound hook's dedup records them
        await hooks_store.remember_delivery(conn, "hk_x", "msg_old", old, clock.now())
        await hooks_store.remember_delivery(conn, "hk_x", "msg_new", new, clock.now())
    assert await services.retention.prune() == 1
    async with db.read() as conn:
        assert await hooks_store.seen_delivery(conn, "hk_x", "msg_old") is None
        assert await hooks_store.seen_delivery(conn, "hk_x", "msg_new") == new
    remaining = [r.run_id for r in (await services.runs.list(who, limit=10, cursor=None)).data]
    assert remaining == [new]
    page = await services.webhooks.list_events(who, limit=100, cursor=None)
    assert {e.run_id for e in page.data} == {new}
    deliveries = await services.webhooks.list_deliveries(who, limit=100, cursor=None)
    assert {d.run_id for d in deliveries.data} == {new}
    assert old not in remaining
    assert await services.retention.prune() == 0


async def test_retention_prunes_old_signals_but_not_one_a_waiting_run_took(
    services: Services, db: Database
) -> None:
    from flowhook.store import signals as signals_store

    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    for s in (services.runs, services.retention, services.signals):
        s._clock = clock  # type: ignore[attr-defined]
    key = await services.keys.create(Mode.TEST, "w")
    who = await services.keys.authenticate(f"Bearer {key.key}")
    flow = await services.flows.create(
        who, {"name": "w", "steps": [{"id": "w", "type": "wait", "signal": "go"}]}
    )
    waiting = (await services.runs.start(who, flow_id=flow.flow_id, payload={})).run.run_id
    worker = Worker(db, clock, services.wakeup)
    await worker.run_once()
    await worker.drain()
    stale = await services.signals.send(who, "other", {})
    taken = await services.signals.send(who, "go", {})
    assert taken.matched == 1  # the run is woken but no worker has taken it yet
    clock.advance(31 * 86400)
    fresh = await services.signals.send(who, "other", {})
    await services.retention.prune()
    async with db.read() as conn:
        assert await signals_store.get_signal(conn, stale.signal.id) is None
        assert await signals_store.get_signal(conn, taken.signal.id) is not None
        assert await signals_store.get_signal(conn, fresh.signal.id) is not None
    assert (await services.runs.get(who, waiting)).status.value == "running"


async def test_retention_batches_plan_without_merge_joins_on_postgresql(db: Database) -> None:
    """Each retention batch on PostgreSQL turns merge joins off for its own transaction only:
    estimating one reads the join keys' index ends, which after a big prune hold millions of
    dead entries (planning grew to ~135 ms a batch at 450,000 runs pruned)."""
    from sqlalchemy import text

    from flowhook.store import retention as retention_store

    before = datetime(2026, 1, 1, tzinfo=UTC)
    steps = (
        lambda c: retention_store.prune_batch(c, before, 10),
        lambda c: retention_store.prune_signals(c, before, 10),
    )
    for step in steps:
        async with db.transaction() as conn:
            assert await step(conn) == 0
            if not db.is_sqlite:
                assert await conn.scalar(text("SHOW enable_mergejoin")) == "off"
        if not db.is_sqlite:
            async with db.transaction() as conn:  # SET LOCAL ended with the transaction
                assert await conn.scalar(text("SHOW enable_mergejoin")) == "on"


def test_a_batch_is_sized_by_how_long_the_last_one_held_the_writer() -> None:
    from flowhook.service.retention import TARGET, next_size

    assert next_size(200, TARGET, 10, 200) == 200  # on target: unchanged
    assert next_size(200, 4 * TARGET, 10, 200) == 50  # four times too slow: a quarter
    assert next_size(40, TARGET / 10, 10, 200) == 80  # fast: at most twice as many
    assert next_size(150, TARGET / 10, 10, 200) == 200  # never past the most
    assert next_size(200, 10.0, 10, 200) == 10  # never below the least
    assert next_size(200, 0.0, 10, 200) == 200  # a batch too fast to time


async def test_slow_batches_get_smaller_and_the_pass_still_ends(db: Database) -> None:
    """A step whose rows cost 0.4 ms each (200 would hold the writer 80 ms): on SQLite each
    batch holds it for about ``TARGET`` at most; on PostgreSQL, whose writers do not
    wait for one another, the batches keep their size. Either way the pass goes to the end."""
    import time

    from flowhook.clock import SystemClock
    from flowhook.service.retention import TARGET, RetentionService

    sizes: list[int] = []
    left = 600

    async def step(conn: object, n: int) -> int:
        nonlocal left
        sizes.append(n)
        done = min(n, left)
        time.sleep(done * 0.0004)  # blocking, as SQLite's statements on the loop's thread
        left -= done
        return done

    service = RetentionService(db, SystemClock(), 30.0)
    assert await service._batches(step, 200) == 600
    if db.is_sqlite:
        assert sizes[0] == 25  # an eighth of the most, growing from there
        assert all(n * 0.0004 <= 2 * TARGET for n in sizes), sizes
    else:
        assert sizes == [200, 200, 200, 200], sizes
    assert left == 0
