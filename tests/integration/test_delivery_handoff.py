"""Deliveries handed to the dispatcher in the transaction that queues them: written as a
claim would leave them (leased, one attempt counted and logged), started by the dispatcher
after the commit without a claim of their own, claimed again like any other after their
lease when the process died before sending; never a FIFO endpoint's, never past a backlog."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from flowhook.clock import FakeClock
from flowhook.engine.worker import Worker
from flowhook.events import make_event
from flowhook.service import Principal, Services
from flowhook.store import events as events_store
from flowhook.store import webhooks as store
from flowhook.store.db import Database
from flowhook.store.models import DeliveryStatus
from flowhook.store.tables import deliveries, delivery_attempts
from flowhook.webhooks import metrics
from flowhook.webhooks.dispatcher import Dispatcher
from tests.conftest import Receiver
from tests.integration.test_dispatcher import dispatcher, setup

LEASE = timedelta(seconds=30)
FLOW = {
    "name": "three transforms",
    "steps": [
        {"id": "a", "type": "transform", "output": {"x": "{{ payload.n + 1 }}"}},
        {"id": "b", "type": "transform", "output": {"y": "{{ steps.a.output.x * 2 }}"}},
    ],
    "output": {"y": "{{ steps.b.output.y }}"},
}


def handoff(clock: FakeClock, room: int) -> store.Handoff:
    """A hand-off that takes ``room`` deliveries in all."""
    return store.Handoff("d1", LEASE, clock.now, lambda _ep, taken, _of: taken < room)


async def raise_with(db: Database, who: Principal, clock: FakeClock, h: store.Handoff) -> None:
    async with db.transaction() as conn:
        conn.info["tx"][store.HANDOFF] = h
        await raise_event_in(conn, who, clock)


async def raise_event_in(conn: Any, who: Principal, clock: FakeClock) -> None:
    event = make_event(
        "flow.completed", workspace_id=who.workspace_id, mode=who.mode,
        flow_id="wf_x", run_id="run_x", payload={"i": 1}, now=clock.now(),
    )  # fmt: skip
    await events_store.insert_events(conn, [event])


async def rows(db: Database) -> list[tuple[Any, list[Any]]]:
    """Every delivery with its attempt lines."""
    async with db.read() as conn:
        found = (await conn.execute(select(deliveries))).all()
        lines = (await conn.execute(select(delivery_attempts))).all()
    by_delivery: dict[str, list[Any]] = {}
    for line in lines:
        by_delivery.setdefault(line.delivery_id, []).append(line)
    return [(r, by_delivery.get(r.id, [])) for r in found]


async def test_taken_deliveries_are_written_claimed_the_rest_queued(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who, (a, b, c) = await setup(services, clock, [f"http://127.0.0.1:9/{n}" for n in "abc"])
    h = handoff(clock, room=2)
    db.wakeups["deliveries"].clear()
    await raise_with(db, who, clock, h)

    assert len(h.claimed) == 2 and h.now == clock.now()
    assert all(d.attempts == 1 and d.url and d.body and d.secret for d in h.claimed)
    written = {r.endpoint_id: (r, lines) for r, lines in await rows(db)}
    taken = {d.endpoint_id for d in h.claimed}
    [queued] = {a, b, c} - taken
    for ep in taken:
        row, lines = written[ep]
        assert (row.status, row.attempts, row.lease_owner) == ("pending", 1, "d1")
        assert row.next_attempt_at.replace(tzinfo=None) == (clock.now() + LEASE).replace(
            tzinfo=None
        )
        assert row.due_at.replace(tzinfo=None) == clock.now().replace(tzinfo=None)
        [line] = lines  # logged before it is sent, as a claim logs it
        assert (line.number, line.finished_at, line.error_class) == (1, None, None)
    row, lines = written[queued]
    assert (row.attempts, row.lease_owner, lines) == (0, None, [])
    assert await db.wakeups["deliveries"].wait(0)  # woken for the one left in the queue

    # A claim now finds only the queued one: the others are under the hand-off's lease.
    now = clock.now()
    async with db.transaction() as conn:
        claimed = await store.claim_deliveries(
            conn, owner="d2", now=now, lease_until=now + LEASE, limit=10, per_endpoint=8
        )
    assert [d.endpoint_id for d in claimed] == [queued]


async def test_a_handed_over_delivery_never_sent_is_claimed_again_after_its_lease(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """The process died after the commit, before the dispatcher sent it: another process
    claims it when the lease ends, as attempt 2, and marks attempt 1 interrupted."""
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    h = handoff(clock, room=10)
    await raise_with(db, who, clock, h)
    [handed] = h.claimed  # ... and never adopted: the process is gone

    other = dispatcher(db, clock)
    await other.open()
    try:
        assert await other.run_once() == 0  # leased
        clock.advance(LEASE.total_seconds() + 1)
        assert await other.run_once() == 1
        await other.drain()
    finally:
        await other.stop()
    [(row, lines)] = await rows(db)
    assert (row.id, row.status, row.attempts) == (handed.id, "succeeded", 2)
    assert [(x.number, x.error_class) for x in sorted(lines, key=lambda x: x.number)] == [
        (1, store.INTERRUPTED),
        (2, None),
    ]
    assert len(receiver.of("flow.completed")) == 1


async def test_fifo_endpoints_are_never_handed_over(services: Services, db: Database) -> None:
    clock = FakeClock()
    who, [ep] = await setup(services, clock, ["http://127.0.0.1:9/fifo"])
    await services.webhooks.update_endpoint(who, ep, {"ordering": "fifo"})
    h = handoff(clock, room=10)
    await raise_with(db, who, clock, h)
    assert h.claimed == []
    [(row, lines)] = await rows(db)
    assert (row.attempts, row.lease_owner, lines) == (0, None, [])


async def _run_flow(
    services: Services, db: Database, clock: FakeClock, receiver: Receiver, n: int
) -> tuple[Worker, Dispatcher, Principal]:
    services.runs._clock = clock  # type: ignore[attr-defined]
    who, _ = await setup(services, clock, [receiver.url])
    flow = await services.flows.create(who, FLOW)
    for i in range(n):
        await services.runs.start(who, flow_id=flow.flow_id, payload={"n": i})
    d = dispatcher(db, clock)
    worker = Worker(db, clock, services.wakeup, owner="d1")
    worker.dispatcher = d
    await d.open()
    return worker, d, who


def _counting_claims(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the deliveries each claim of the queue took."""
    counts: list[int] = []
    real = store.claim_deliveries

    async def claim(conn: Any, **kw: Any) -> Sequence[store.DueDelivery]:
        found = await real(conn, **kw)
        counts.append(len(found))
        return found

    monkeypatch.setattr(store, "claim_deliveries", claim)
    return counts


async def test_the_engine_hands_its_runs_deliveries_to_the_dispatcher(
    services: Services, db: Database, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    worker, d, _ = await _run_flow(services, db, clock, receiver, n=3)
    claims = _counting_claims(monkeypatch)
    try:
        assert await d.run_once() == 0  # the queue is empty: no backlog to honour
        before = metrics.HANDED_OVER._value.get()
        assert await worker.run_once() == 3
        await worker.drain()
        await d.drain()
    finally:
        await worker.stop()
        await d.stop()
    assert claims == [0]  # only the one above: the three were never claimed
    assert metrics.HANDED_OVER._value.get() - before == 3
    assert len(receiver.of("flow.completed")) == 3
    written = await rows(db)
    assert [(r.status, r.attempts) for r, _ in written] == [(str(DeliveryStatus.SUCCEEDED), 1)] * 3


async def test_no_hand_over_while_the_queue_may_hold_due_deliveries(
    services: Services, db: Database, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher that has not yet claimed (or whose last claim was full) may have due
    deliveries waiting: new ones queue behind them."""
    clock = FakeClock()
    worker, d, _ = await _run_flow(services, db, clock, receiver, n=2)
    claims = _counting_claims(monkeypatch)
    try:
        assert d.handoff() is None  # nothing claimed yet
        assert await worker.run_once() == 2
        await worker.drain()
        assert await d.run_once() == 2  # queued, so claimed
        await d.drain()
    finally:
        await worker.stop()
        await d.stop()
    assert claims == [2]
    assert len(receiver.of("flow.completed")) == 2


async def test_no_hand_over_past_the_dispatchers_room(
    services: Services, db: Database, receiver: Receiver
) -> None:
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    d = dispatcher(db, clock, concurrency=1, per_endpoint=1)
    await d.open()
    try:
        assert await d.run_once() == 0
        h = d.handoff()
        assert h is not None
        async with db.transaction() as conn:
            conn.info["tx"][store.HANDOFF] = h
            for _ in range(6):
                await raise_event_in(conn, who, clock)
        assert len(h.claimed) == 4  # HOLD × per_endpoint
        assert d.handoff() is None  # some went to the queue: later ones go behind them
        d.adopt(h)
        await d.drain()
        assert await d.run_once() == 2
        await d.drain()
    finally:
        await d.stop()
    assert len(receiver.of("flow.completed")) == 6
    assert {r.status for r, _ in await rows(db)} == {str(DeliveryStatus.SUCCEEDED)}


async def test_a_stopping_dispatcher_adopts_nothing(
    services: Services, db: Database, receiver: Receiver
) -> None:
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    d = dispatcher(db, clock)
    await d.open()
    assert await d.run_once() == 0
    h = d.handoff()
    assert h is not None
    await raise_with(db, who, clock, h)
    await d.stop()
    d.adopt(h)  # committed while it stopped: left to the claim after the lease
    assert d._inflight == {}
    assert receiver.requests == []
    [(row, _)] = await rows(db)
    assert (row.status, row.lease_owner) == ("pending", "d1")
