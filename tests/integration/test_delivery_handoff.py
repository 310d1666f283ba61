"""Deliveries handed to the dispatcher in the transaction that queues them: written as a
claim would leave them (leased, one attempt counted and logged), started by the dispatcher
after the commit without a claim of their own, claimed again like any other after their
lease when the process died before sending; never a FIFO endpoint's, never past a due
delivery waiting in the queue, never past the dispatcher's room."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.clock import FakeClock
from flowhook.engine.worker import Worker
from flowhook.errors import WriteConflict
from flowhook.events import make_event
from flowhook.service import Principal, Services
from flowhook.store import deliveries as deliveries_store
from flowhook.store import delivery_queue
from flowhook.store import events as events_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.error_classes import ErrorClass
from flowhook.store.models import DeliveryStatus
from flowhook.store.tables import deliveries, delivery_attempts
from flowhook.webhooks import metrics
from flowhook.webhooks.dispatcher import HOLD, Dispatcher
from tests.conftest import Receiver
from tests.integration.test_dispatcher import dispatcher, raise_event, setup

LEASE = timedelta(seconds=30)
FLOW = {
    "name": "two transforms",
    "steps": [
        {"id": "a", "type": "transform", "output": {"x": "{{ payload.n + 1 }}"}},
        {"id": "b", "type": "transform", "output": {"y": "{{ steps.a.output.x * 2 }}"}},
    ],
    "output": {"y": "{{ steps.b.output.y }}"},
}


def handoff(clock: FakeClock, room: int, *, later: float = 0.0) -> deliveries_store.Handoff:
    """A hand-off that takes ``room`` deliveries in all, claiming ``later`` seconds after
    the clock's time (when its events were made)."""
    h: deliveries_store.Handoff

    def fits(_endpoint: str) -> bool:
        return h.taken.total() < room

    h = deliveries_store.Handoff("d1", LEASE, lambda: clock.now() + timedelta(seconds=later), fits)
    return h


async def raise_with(
    db: Database, who: Principal, clock: FakeClock, h: deliveries_store.Handoff
) -> None:
    async with db.transaction() as conn:
        await raise_event_in(conn, who, clock, h)


async def raise_event_in(
    conn: AsyncConnection,
    who: Principal,
    clock: FakeClock,
    h: deliveries_store.Handoff | None = None,
) -> None:
    event = make_event(
        "flow.completed", workspace_id=who.workspace_id, mode=who.mode,
        flow_id="wf_x", run_id="run_x", payload={"i": 1}, now=clock.now(),
    )  # fmt: skip
    await events_store.insert_events(conn, [event], handoff=h)


async def rows(db: Database) -> list[tuple[Any, list[Any]]]:
    """Every delivery with its attempt lines, oldest first."""
    async with db.read() as conn:
        found = (await conn.execute(select(deliveries).order_by(deliveries.c.id))).all()
        lines = (await conn.execute(select(delivery_attempts))).all()
    by_delivery: dict[str, list[Any]] = {}
    for line in lines:
        by_delivery.setdefault(line.delivery_id, []).append(line)
    return [(r, sorted(by_delivery.get(r.id, []), key=lambda x: x.number)) for r in found]


def naive(value: Any) -> Any:
    return value.replace(tzinfo=None)


async def test_taken_deliveries_are_written_claimed_the_rest_queued(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who, (a, b, c) = await setup(services, clock, [f"http://127.0.0.1:9/{n}" for n in "abc"])
    made = clock.now()
    h = handoff(clock, room=2, later=1.0)
    db.wakeups["deliveries"].clear()
    await raise_with(db, who, clock, h)

    claimed_at = made + timedelta(seconds=1)
    assert len(h.claimed) == 2 and h.now == claimed_at
    assert all(d.attempts == 1 and d.url and d.body and d.secret for d in h.claimed)
    written = {r.endpoint_id: (r, lines) for r, lines in await rows(db)}
    taken = {d.endpoint_id for d in h.claimed}
    [queued] = {a, b, c} - taken
    for ep in taken:  # as claim_deliveries leaves a delivery it claims
        row, lines = written[ep]
        assert (row.status, row.attempts, row.lease_owner) == ("pending", 1, "d1")
        assert naive(row.next_attempt_at) == naive(row.lease_expires_at)
        assert naive(row.lease_expires_at) == naive(claimed_at + LEASE)
        assert naive(row.due_at) == naive(made)  # when it fell due: a claim leaves it
        [line] = lines  # logged before it is sent
        assert (line.number, naive(line.started_at)) == (1, naive(claimed_at))
        assert (line.finished_at, line.error_class) == (None, None)
    row, lines = written[queued]
    assert (row.attempts, row.lease_owner, lines) == (0, None, [])
    assert naive(row.next_attempt_at) == naive(made)
    assert await db.wakeups["deliveries"].wait(0)  # woken for the one left in the queue

    # A claim now finds only the queued one: the others are under the hand-off's lease.
    now = clock.now()
    async with db.transaction() as conn:
        claimed = await delivery_queue.claim_deliveries(
            conn, owner="d2", now=now, lease_until=now + LEASE, limit=10, per_endpoint=8
        )
    assert [d.endpoint_id for d in claimed] == [queued]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_what_a_hand_off_reads_is_what_a_claim_reads(
    services: Services, db: Database
) -> None:
    """On PostgreSQL a hand-off writes its rows, logs its attempts and reads them back in
    one statement of its own (SQLite reads them as the claim does): it gives the dispatcher
    the same deliveries, field for field, as the claim's read of the same rows."""
    clock = FakeClock()
    who, _ = await setup(services, clock, [f"http://127.0.0.1:9/{n}" for n in "abc"])
    h = handoff(clock, room=2)
    await raise_with(db, who, clock, h)
    assert len(h.claimed) == 2
    async with db.read() as conn:
        read = await delivery_queue.due_deliveries(conn, [d.id for d in h.claimed])
    by_id = sorted(h.claimed, key=lambda d: d.id)
    assert by_id == sorted(read, key=lambda d: d.id)
    assert all(d.run_id == "run_x" and d.flow_id == "wf_x" and d.attempts == 1 for d in by_id)


async def test_nothing_is_taken_while_a_due_delivery_waits_in_the_queue(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who, _ = await setup(services, clock, ["http://127.0.0.1:9/a"])
    await raise_event(db, who, clock)  # queued, due now, nobody claimed it yet
    h = handoff(clock, room=10)
    await raise_with(db, who, clock, h)
    assert h.claimed == []
    assert [(r.attempts, r.lease_owner) for r, _ in await rows(db)] == [(0, None)] * 2

    now = clock.now()  # once the queue is claimed, new ones are taken again
    async with db.transaction() as conn:
        await delivery_queue.claim_deliveries(
            conn, owner="d2", now=now, lease_until=now + LEASE, limit=10, per_endpoint=8
        )
    again = handoff(clock, room=10)
    await raise_with(db, who, clock, again)
    assert len(again.claimed) == 1


@pytest.mark.parametrize("waiting", [False, True])
async def test_the_subscribers_query_looks_at_the_queue_once_per_transaction(
    services: Services, db: Database, monkeypatch: pytest.MonkeyPatch, waiting: bool
) -> None:
    """Whether a due delivery waits is asked in the query that finds the subscribers (one
    round trip fewer per progress transaction), once per transaction however many batches
    of events it writes; the statement of its own is left for a transaction that queues
    without looking them up (a test event)."""
    clock = FakeClock()
    who, _ = await setup(services, clock, ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    if waiting:
        await raise_event(db, who, clock)  # two queued, due now, nobody claimed them
    asked: list[object] = []

    async def counted(conn: AsyncConnection, now: Any) -> bool:
        asked.append(now)
        return False

    monkeypatch.setattr(deliveries_store, "_waiting", counted)
    h = handoff(clock, room=10)
    async with db.transaction() as conn:
        await raise_event_in(conn, who, clock, h)
        assert h.looked and h.full is waiting
        await raise_event_in(conn, who, clock, h)
    assert asked == []
    assert len(h.claimed) == (0 if waiting else 4)
    queued = [r for r, _ in await rows(db) if r.lease_owner is None]
    assert len(queued) == (6 if waiting else 0)


async def test_a_handed_over_delivery_never_sent_is_claimed_again_after_its_lease(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """The process died after the commit, before its dispatcher sent it: another process
    claims it when the lease ends, as attempt 2, and marks attempt 1 interrupted."""
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    h = handoff(clock, room=10)
    await raise_with(db, who, clock, h)
    [handed] = h.claimed  # ... and never adopted: the process is gone

    other = Dispatcher(
        db, clock, db.wakeups["deliveries"], owner="d2", allow_private_targets=True, timeout=2.0
    )
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
    assert [(x.number, x.error_class) for x in lines] == [(1, ErrorClass.INTERRUPTED), (2, None)]
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


async def _worker(
    services: Services, db: Database, clock: FakeClock, receiver: Receiver, n: int
) -> tuple[Worker, Dispatcher]:
    """``n`` runs queued, a worker that hands their deliveries to a dispatcher (not
    claiming: the tests drive it)."""
    services.runs._clock = clock  # type: ignore[attr-defined]
    who, _ = await setup(services, clock, [receiver.url])
    flow = await services.flows.create(who, FLOW)
    for i in range(n):
        await services.runs.start(who, flow_id=flow.flow_id, payload={"n": i})
    d = dispatcher(db, clock)
    worker = Worker(db, clock, services.wakeup, owner="d1")
    worker.dispatcher = d
    await d.open()
    return worker, d


def _counting_claims(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the deliveries each claim of the queue took."""
    counts: list[int] = []
    real = delivery_queue.claim_deliveries

    async def claim(conn: AsyncConnection, **kw: Any) -> Sequence[delivery_queue.DueDelivery]:
        found = await real(conn, **kw)
        counts.append(len(found))
        return found

    monkeypatch.setattr(delivery_queue, "claim_deliveries", claim)
    return counts


async def test_the_engine_hands_its_runs_deliveries_to_the_dispatcher(
    services: Services, db: Database, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    worker, d = await _worker(services, db, clock, receiver, n=3)
    claims = _counting_claims(monkeypatch)
    before = metrics.HANDED_OVER._value.get()
    try:
        assert await worker.run_once() == 3
        await worker.drain()
        await d.drain()  # nothing claims them: they were sent because they were handed over
    finally:
        await worker.stop()
        await d.stop()
    assert claims == []
    assert metrics.HANDED_OVER._value.get() - before == 3
    assert len(receiver.of("flow.completed")) == 3
    assert [(r.status, r.attempts) for r, _ in await rows(db)] == [("succeeded", 1)] * 3


async def test_a_progress_write_tried_again_hands_over_only_what_it_committed(
    services: Services, db: Database, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conflict rolls the first try back after its deliveries were taken; the second
    try's are the ones started, each once."""
    clock = FakeClock()
    worker, d = await _worker(services, db, clock, receiver, n=2)
    real = runs_store.apply_progress
    tries: list[int] = []

    async def conflicting(
        conn: AsyncConnection,
        items: Sequence[runs_store.Progress],
        *,
        owner: str,
        handoff: deliveries_store.Handoff | None = None,
    ) -> list[bool]:
        applied = await real(conn, items, owner=owner, handoff=handoff)
        assert handoff is not None
        tries.append(len(handoff.claimed))
        if len(tries) == 1:
            raise WriteConflict("the first try loses")
        return applied

    monkeypatch.setattr(runs_store, "apply_progress", conflicting)
    try:
        assert await worker.run_once() == 2
        await worker.drain()
        await d.drain()
    finally:
        await worker.stop()
        await d.stop()
    assert tries[0] > 0 and sum(tries[1:]) == 2
    assert d._handing == []
    assert len(receiver.of("flow.completed")) == 2
    assert [(r.status, r.attempts, len(lines)) for r, lines in await rows(db)] == [
        ("succeeded", 1, 1)
    ] * 2


async def test_a_progress_write_that_fails_gives_back_what_it_took(
    services: Services, db: Database, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    worker, d = await _worker(services, db, clock, receiver, n=1)
    real = runs_store.apply_progress

    async def failing(
        conn: AsyncConnection,
        items: Sequence[runs_store.Progress],
        *,
        owner: str,
        handoff: deliveries_store.Handoff | None = None,
    ) -> list[bool]:
        await real(conn, items, owner=owner, handoff=handoff)
        assert d._held() == 1  # taken, not yet started: counted against the room
        raise RuntimeError("this progress cannot be stored")

    monkeypatch.setattr(runs_store, "apply_progress", failing)
    try:
        assert await worker.run_once() == 1
        await worker.drain()
    finally:
        await worker.stop()
        await d.stop()
    assert (d._handing, d._held(), await rows(db)) == ([], 0, [])


async def test_no_hand_over_past_the_dispatchers_room(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """Two endpoints, 2 request slots, 1 per endpoint: it holds 4 of an endpoint and 8 in
    all; what a hand-off took counts until it is started, and the rest wait in the queue
    (and so does everything after the first that did not fit)."""
    clock = FakeClock()
    who, (a, b) = await setup(services, clock, [receiver.url + "/a", receiver.url + "/b"])
    d = dispatcher(db, clock, concurrency=2, per_endpoint=1)
    await d.open()
    try:
        h = d.handoff()
        assert h is not None
        async with db.transaction() as conn:
            for _ in range(3):
                await raise_event_in(conn, who, clock, h)  # one delivery to each endpoint
            assert d._held() == 6 and d._endpoints_at_cap() == []
            for _ in range(3):
                await raise_event_in(conn, who, clock, h)
        assert Counter(x.endpoint_id for x in h.claimed) == {a: HOLD, b: HOLD}
        assert d._held() == 2 * HOLD and d._endpoints_at_cap() == [a, b]
        assert await d.run_once() == 0  # full: the 4 queued wait
        d.adopt(h)
        await d.drain()
        assert await d.run_once() == 4
        await d.drain()
    finally:
        await d.stop()
    assert len(receiver.of("flow.completed")) == 12
    assert {r.status for r, _ in await rows(db)} == {str(DeliveryStatus.SUCCEEDED)}


async def test_a_stopping_dispatcher_leaves_what_was_handed_over_to_the_lease(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """Handed over, committed after the dispatcher began to stop: nothing is sent here; the
    delivery is held under its lease like one claimed and not yet sent, and goes when the
    lease ends."""
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    d = dispatcher(db, clock)
    await d.open()
    h = d.handoff()
    assert h is not None
    await raise_with(db, who, clock, h)
    await d.stop()
    d.adopt(h)
    assert (d._inflight, d._handing, receiver.requests) == ({}, [], [])
    [(row, _)] = await rows(db)
    assert (row.status, row.lease_owner) == ("pending", "d1")
