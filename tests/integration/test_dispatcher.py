"""The dispatcher on a fake clock: the spec's retry schedule without sleeping, endpoint
health, fairness across endpoints."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from flowhook.clock import FakeClock
from flowhook.events import make_event
from flowhook.service import Principal, Services
from flowhook.store import events as events_store
from flowhook.store.db import Database
from flowhook.store.models import Mode
from flowhook.store.wakeup import Wakeup
from flowhook.webhooks.dispatcher import HOLD, REMEMBER, Dispatcher
from tests.conftest import Receiver


async def setup(
    services: Services, clock: FakeClock, urls: list[str]
) -> tuple[Principal, list[str]]:
    created = await services.keys.create(Mode.TEST, "ws")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    services.webhooks._clock = clock  # type: ignore[attr-defined]
    ids = []
    for url in urls:
        ep = await services.webhooks.create_endpoint(who, url=url, events=["flow.completed"])
        ids.append(ep.id)
    return who, ids


async def raise_event(db: Database, who: Principal, clock: FakeClock, n: int = 1) -> None:
    async with db.transaction() as conn:
        for i in range(n):
            await events_store.insert_events(
                conn,
                [
                    make_event(
                        "flow.completed", workspace_id=who.workspace_id, mode=who.mode,
                        flow_id="wf_x", run_id=f"run_{i}", payload={"i": i}, now=clock.now(),
                    )
                ],
            )  # fmt: skip


def dispatcher(db: Database, clock: FakeClock, **kw: Any) -> Dispatcher:
    return Dispatcher(
        db, clock, Wakeup(), owner="d1", allow_private_targets=True, timeout=2.0, **kw
    )


async def pump(d: Dispatcher) -> int:
    claimed = await d.run_once()
    await d.drain()
    return claimed


async def test_spec_schedule_30s_2min_10min_then_failed(
    services: Services, db: Database, receiver: Receiver
) -> None:
    receiver.default = (500, {})
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock)
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 1  # attempt 1 at t=0
        for wait in (30, 120, 600):
            clock.advance(wait - 0.01)
            assert await pump(d) == 0, f"attempt came before {wait} s"
            clock.advance(wait * 0.10 + 0.02)  # past the largest jitter
            assert await pump(d) == 1
        clock.advance(7200)
        assert await pump(d) == 0  # four attempts in all
    finally:
        await d.stop()
    assert len(receiver.requests) == 4
    page = await services.webhooks.list_deliveries(who, limit=10, cursor=None, status="failed")
    assert [x.attempts for x in page.data] == [4]


async def test_an_endpoint_failing_for_the_whole_window_is_disabled(
    services: Services, db: Database, receiver: Receiver
) -> None:
    receiver.default = (400, {})
    clock = FakeClock()
    who, [ep_id] = await setup(services, clock, [receiver.url])
    d = dispatcher(db, clock, disable_after=5 * 86400)
    await d.open()
    try:
        for _ in range(6):
            await raise_event(db, who, clock)
            await pump(d)
            clock.advance(86400)
    finally:
        await d.stop()
    ep = await services.webhooks.get_endpoint(who, ep_id)
    assert ep.enabled is False
    assert ep.disabled_reason
    enabled = await services.webhooks.update_endpoint(who, ep_id, {"enabled": True})
    assert (enabled.enabled, enabled.disabled_reason, enabled.failing_since) == (True, None, None)


async def test_successes_end_their_endpoints_failure_windows_and_a_failure_between_keeps_its(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """One group commit marks endpoints in id order: here a success, a failure, a success;
    then successes alone."""
    failing = {"/a", "/b", "/c"}
    original = receiver.handle

    async def handle(request: Any) -> Any:
        if request.path in failing:
            await request.read()
            return web.json_response({}, status=400)  # a final failure: no retry
        return await original(request)

    receiver.handle = handle  # type: ignore[method-assign]
    clock = FakeClock()
    who, ids = await setup(services, clock, [f"{receiver.url}/{p}" for p in "abc"])
    assert ids == sorted(ids)  # ids are in the order made: a, b, c
    d = dispatcher(db, clock)
    await d.open()
    try:
        await raise_event(db, who, clock)
        assert await pump(d) == 3
        first = [(await services.webhooks.get_endpoint(who, i)).failing_since for i in ids]
        assert all(at is not None for at in first)

        failing = {"/b"}
        clock.advance(60)
        await raise_event(db, who, clock)
        assert await pump(d) == 3
        after = [(await services.webhooks.get_endpoint(who, i)).failing_since for i in ids]
        assert after == [None, first[1], None]

        failing = set()  # a group of successes alone (one statement on PostgreSQL)
        clock.advance(60)
        await raise_event(db, who, clock)
        assert await pump(d) == 3
    finally:
        await d.stop()
    after = [(await services.webhooks.get_endpoint(who, i)).failing_since for i in ids]
    assert after == [None, None, None]


async def test_a_slow_endpoint_does_not_hold_back_the_others(
    services: Services, db: Database, receiver: Receiver
) -> None:
    receiver.delay = 0.0
    slow_hits = slow_now = slow_most = 0
    release = asyncio.Event()  # the slow endpoint answers only once the test is done
    original = receiver.handle

    async def handle(request: Any) -> Any:
        nonlocal slow_hits, slow_now, slow_most
        if request.path == "/slow":
            slow_hits += 1
            slow_now += 1
            slow_most = max(slow_most, slow_now)
            try:
                await release.wait()
            finally:
                slow_now -= 1
        return await original(request)

    def fast_done() -> int:
        return len([r for r in receiver.requests if r["path"] == "/fast"])

    receiver.handle = handle  # type: ignore[method-assign]
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url + "/slow", receiver.url + "/fast"])
    await raise_event(db, who, clock, n=30)  # 30 deliveries to each endpoint
    d = dispatcher(db, clock, concurrency=16, per_endpoint=4)
    await d.open()
    try:
        await d.run_once()
        assert sum(d._per_endpoint.values()) <= HOLD * 16  # held: claimed, not completed
        assert max(d._per_endpoint.values()) <= HOLD * 4
        for _ in range(1000):  # until every fast one is done (an event, bounded)
            if fast_done() == 30:
                break
            await d.run_once()
            await asyncio.sleep(0.01)
        assert fast_done() == 30  # all of them while the slow ones still hang
        assert slow_most <= 4  # never more requests in flight to one endpoint than its cap
        assert slow_hits <= 4
    finally:
        release.set()
        await d.stop(grace=5)


async def test_a_held_delivery_is_sent_once_even_when_its_lease_runs_out_while_it_waits(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """Deliveries held for a slow endpoint wait for a request slot. One whose lease is about
    to end renews it before sending; one whose lease already ended and that another process
    claimed is left to that process. Either way each delivery is sent exactly once."""
    receiver.delay = 0.3
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock, n=3)
    a = dispatcher(db, clock, per_endpoint=1)
    b = Dispatcher(
        db, clock, Wakeup(), owner="d2", allow_private_targets=True, timeout=2.0, per_endpoint=1
    )
    await a.open()
    await b.open()
    try:
        assert await a.run_once() == 3  # one request in flight, two held behind it
        clock.advance(a.lease.total_seconds() - 0.5)  # too little lease left for a request
        for _ in range(1000):  # the second goes out once the first is answered (0.3 s) ...
            if len(receiver.requests) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(receiver.requests) == 2  # ... its lease renewed first
        clock.advance(1.0)  # the third's lease has ended while it still waits
        assert await b.run_once() == 1  # another process takes it over (not the renewed one)
        await a.drain()
        await b.drain()
    finally:
        await a.stop()
        await b.stop()
    sent = [r["headers"]["X-Service-Event-Id"] for r in receiver.requests]
    assert len(sent) == 3 and len(set(sent)) == 3  # all three, none twice


@pytest.mark.parametrize("status", [200, 500])
async def test_an_endpoint_gets_more_requests_in_flight_only_while_it_answers_fast(
    services: Services, db: Database, receiver: Receiver, status: int
) -> None:
    """Every fast 2xx gives an endpoint one more request slot, up to ``per_endpoint``; one
    that fails stays at the slow endpoints' 8 (``slots.SLOW``)."""
    in_flight = most = 0
    original = receiver.handle

    async def handle(request: Any) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.05)
            return await original(request)
        finally:
            in_flight -= 1

    receiver.handle = handle  # type: ignore[method-assign]
    receiver.default = (status, {"ok": status == 200})
    clock = FakeClock()
    who, [endpoint] = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock, n=120)
    d = dispatcher(db, clock, per_endpoint=16)
    await d.open()
    try:
        while len(receiver.requests) < 120 and await pump(d):
            pass
    finally:
        await d.stop()
    assert len(receiver.requests) == 120
    if status == 200:
        assert 8 < most <= 16
        assert d._sending[endpoint].limit == 16  # remembered while it holds nothing
    else:
        assert most == 8
        assert endpoint not in d._sending  # at the floor: nothing to remember


async def test_an_endpoint_quiet_for_a_while_starts_again_at_the_floor(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """Slots above the floor are remembered while the process holds nothing of an endpoint,
    for ``REMEMBER``; then the next endpoint to go quiet drops them, so a deleted endpoint
    is not remembered for ever."""
    clock = FakeClock()
    who, [a] = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock, n=40)
    d = dispatcher(db, clock, per_endpoint=16)
    await d.open()
    try:
        while await pump(d):
            pass
        assert d._sending[a].limit == 16 and list(d._resting) == [a]
        await services.webhooks.delete_endpoint(who, a)
        b = (await services.webhooks.create_endpoint(
            who, url=receiver.url, events=["flow.completed"]
        )).id  # fmt: skip
        clock.advance(REMEMBER.total_seconds() - 1)
        await raise_event(db, who, clock)
        assert await pump(d) == 1
        assert list(d._resting) == [a, b]  # b answered fast once: 9 slots, remembered
        clock.advance(2)
        await raise_event(db, who, clock)
        assert await pump(d) == 1
        assert list(d._resting) == [b] and set(d._sending) == {b}
        assert d._sending[b].limit == 10
    finally:
        await d.stop()
