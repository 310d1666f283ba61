"""Flow control of webhook deliveries on both backends: an endpoint's `filter.flow_ids`,
`ordering: "fifo"` (one in flight, in event order, a failing one holding the rest through
its retries) and `rate_limit` (deliveries a second), with their validation and the PATCH
that lifts FIFO."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import select, update

from flowhook.clock import FakeClock
from flowhook.events import make_event
from flowhook.ids import new_id
from flowhook.service import Services
from flowhook.store import deliveries as deliveries_store
from flowhook.store import delivery_queue, types
from flowhook.store import events as events_store
from flowhook.store.db import Database
from flowhook.store.models import Delivery, Mode
from flowhook.store.tables import deliveries
from flowhook.store.wakeup import Wakeup
from flowhook.webhooks.dispatcher import LATE, Dispatcher
from tests.conftest import Api, Receiver
from tests.integration.test_webhooks import FLOW, until


async def make_endpoint(api: Api, url: str, **extra: Any) -> dict[str, Any]:
    body = {"url": url, "events": ["flow.completed"], **extra}
    r = await api.post("/api/v1/webhooks/endpoints", body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def run_all(api: Api, flow_id: str, n: int) -> list[str]:
    ids = [await api.execute(flow_id, {"order_id": i}) for i in range(n)]
    for run_id in ids:
        assert (await api.wait(run_id))["status"] == "completed"
    return ids


def event_id(request: dict[str, Any]) -> str:
    return str(request["headers"]["X-Service-Event-Id"])


def delivered_orders(receiver: Receiver) -> list[int]:
    return [orjson.loads(r["body"])["payload"]["order_id"] for r in receiver.of("flow.completed")]


async def test_a_filter_sends_only_the_events_of_its_flows(api: Api, receiver: Receiver) -> None:
    wanted = await api.create_flow({**FLOW, "name": "wanted"})
    other = await api.create_flow({**FLOW, "name": "other"})
    ep = await make_endpoint(api, receiver.url, filter={"flow_ids": [wanted]})
    assert ep["filter"] == {"flow_ids": [wanted]}
    await run_all(api, wanted, 2)
    await run_all(api, other, 2)
    await until(lambda: len(receiver.of("flow.completed")) >= 2)
    await asyncio.sleep(0.3)
    bodies = [orjson.loads(r["body"]) for r in receiver.of("flow.completed")]
    assert len(bodies) == 2 and {b["flow_id"] for b in bodies} == {wanted}
    r = await api.client.patch(
        f"/api/v1/webhooks/endpoints/{ep['id']}", json={"filter": None}, headers=api.auth()
    )
    assert r.status_code == 200 and r.json()["filter"] is None, r.text
    await run_all(api, other, 1)
    await until(lambda: len(receiver.of("flow.completed")) == 3)


async def test_fifo_sends_one_at_a_time_in_event_order_through_retries(
    api: Api, receiver: Receiver
) -> None:
    in_flight = peak = 0
    original = receiver.handle

    async def counting(request: Any) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await original(request)
        finally:
            in_flight -= 1

    receiver.handle = counting  # type: ignore[method-assign]
    receiver.delay = 0.02
    receiver.script = [(500, {}), (503, {})]  # the first delivery fails twice, then goes
    ep = await make_endpoint(api, receiver.url, ordering="fifo")
    assert ep["ordering"] == "fifo"
    flow_id = await api.create_flow(FLOW)
    for i in range(6):  # one after another: runs claimed together may finish in either order,
        # and FIFO is the order of the events (a run's flow.completed), not of the requests
        run_id = await api.execute(flow_id, {"order_id": i})
        assert (await api.wait(run_id))["status"] == "completed"
    await until(lambda: len(receiver.of("flow.completed")) >= 8, timeout=20)
    assert delivered_orders(receiver) == [0, 0, 0, 1, 2, 3, 4, 5]  # retries hold the rest
    assert peak == 1


async def test_lifting_fifo_lets_the_held_deliveries_go(api: Api, receiver: Receiver) -> None:
    receiver.default = (500, {})  # every attempt fails: the first holds the others
    ep = await make_endpoint(api, receiver.url, ordering="fifo")
    flow_id = await api.create_flow(FLOW)
    await run_all(api, flow_id, 3)
    await until(lambda: len(receiver.of("flow.completed")) >= 1)
    await asyncio.sleep(0.3)
    # One delivery goes, the others wait behind it: the earliest event's (the engine may
    # complete the three runs in one batch, in any order) holds the next two.
    first = {event_id(r) for r in receiver.of("flow.completed")}
    assert len(first) == 1, delivered_orders(receiver)
    r = await api.client.patch(
        f"/api/v1/webhooks/endpoints/{ep['id']}", json={"ordering": None}, headers=api.auth()
    )
    assert r.status_code == 200 and r.json()["ordering"] is None, r.text
    await until(lambda: {0, 1, 2} <= set(delivered_orders(receiver)))
    assert first == {min(event_id(r) for r in receiver.of("flow.completed"))}


async def test_a_rate_limit_spreads_deliveries(api: Api, receiver: Receiver) -> None:
    await make_endpoint(api, receiver.url, rate_limit=10)
    flow_id = await api.create_flow(FLOW)
    ids = await asyncio.gather(*(api.execute(flow_id, {"order_id": i}) for i in range(15)))
    for run_id in ids:
        assert (await api.wait(run_id))["status"] == "completed"
    await until(lambda: len(receiver.of("flow.completed")) == 15, timeout=20)
    # When each request went out, as the dispatcher logged it after waiting for its slot
    # (the receiver's clock adds how late its own busy loop read each request)
    r = await api.get("/api/v1/webhooks/deliveries?limit=50")
    starts = []
    for d in r.json()["data"]:
        one = (await api.get(f"/api/v1/webhooks/deliveries/{d['id']}")).json()
        starts += [datetime.fromisoformat(a["started_at"]) for a in one["attempt_log"]]
    times = sorted((t - starts[0]).total_seconds() for t in starts)
    assert len(times) == 15, times
    for i in range(10, len(times)):  # slots 0.1 s apart; a busy loop may send one late
        assert times[i] - times[i - 10] >= 1.0 - 0.1, times
    assert times[-1] - times[0] >= 1.4 - 0.1, times


async def test_a_stall_does_not_let_the_slots_it_missed_go_at_once(
    services: Services, db: Database
) -> None:
    """Paced deliveries asleep for their slots when the process stalls half a second: the
    ones that wake more than ``LATE`` after their slot take new slots, so after the stall
    they still go 1 / rate_limit apart, never in a burst (as they did before)."""
    who = await services.keys.authenticate(
        f"Bearer {(await services.keys.create(Mode.TEST, 'ws')).key}"
    )
    ep = await services.webhooks.create_endpoint(
        who, url="http://127.0.0.1:9/", events=["flow.completed"], rate_limit=10
    )
    clock = FakeClock(datetime.now(UTC))
    t0 = clock.now()
    d = Dispatcher(db, clock, Wakeup(), owner="d1")
    due = delivery_queue.DueDelivery(
        id="dlv_x", event_id="evt_x", event_type="flow.completed", endpoint_id=ep.id,
        attempts=1, body=b"{}", url=ep.url, enabled=True, secret="s", previous_secret=None,
        previous_secret_expires_at=None, failing_since=None, created_at=t0, rate_limit=10,
    )  # fmt: skip
    went: list[float] = []

    async def paced() -> None:
        await d._paced(due)
        went.append((clock.now() - t0).total_seconds())

    async def settled() -> None:
        """Until every delivery has gone or sleeps for its slot: nothing moves until the
        clock does."""
        async with asyncio.timeout(10):
            while len(went) + clock.sleepers < 8:
                await asyncio.sleep(0.005)

    tasks = [asyncio.create_task(paced()) for _ in range(8)]  # slots 0, 0.1, ..., 0.7 s
    await settled()
    assert went == [0.0]
    clock.advance(0.52)  # the stall: slots 0.1-0.5 pass while the process is stopped
    while len(went) < 8:
        await settled()
        clock.advance(0.01)
    await asyncio.gather(*tasks)
    gaps = [b - a for a, b in itertools.pairwise(sorted(went))]
    assert min(gaps) >= 0.1 - LATE - 0.01, gaps  # before: four went within a millisecond
    assert sorted(went)[-1] >= 1.0, went  # four slots were taken again, at the end


async def test_bad_controls_answer_400_naming_the_field(api: Api, receiver: Receiver) -> None:
    for extra, field in [
        ({"rate_limit": 0}, "rate_limit"),
        ({"ordering": "lifo"}, "ordering"),
        ({"filter": {"flow_ids": ["nope"]}}, "filter.flow_ids"),
        ({"filter": {}}, "filter"),
    ]:
        body = {"url": receiver.url, "events": ["flow.completed"], **extra}
        r = await api.post("/api/v1/webhooks/endpoints", body)
        assert r.status_code == 400, (extra, r.text)
        assert field in r.json()["error"], (extra, r.text)


async def _statuses(db: Database, ids: list[str]) -> list[tuple[str, bool]]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(deliveries.c.id, deliveries.c.status, deliveries.c.due_at).where(
                    deliveries.c.id.in_(ids)
                )
            )
        ).all()
    by_id = {r.id: (r.status, r.due_at.replace(tzinfo=UTC) == types.HELD) for r in rows}
    return [by_id[i] for i in ids]


async def test_fifo_holds_all_but_one_and_releases_in_event_order(db: Database) -> None:
    """Queued together, one delivery is due and the rest held; while any is due (an endpoint
    made FIFO with several in hand) nothing more is released; then the oldest held goes."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    events = [
        make_event("flow.completed", workspace_id="ws_a", mode=Mode.TEST, flow_id="wf_x",
                   run_id=None, payload={"n": i}, now=now + timedelta(seconds=i))
        for i in range(4)
    ]  # fmt: skip
    queued = [Delivery.queued(new_id("dlv"), e, "ep_f") for e in events]
    ids = [d.id for d in queued]
    async with db.transaction() as conn:
        await events_store.insert_events(conn, events)
        await deliveries_store.insert_deliveries(conn, queued, fifo=["ep_f"])
    assert await _statuses(db, ids) == [("pending", False)] + [("pending", True)] * 3
    async with db.transaction() as conn:  # as if a second were in hand when FIFO was set
        await conn.execute(update(deliveries).where(deliveries.c.id == ids[1]).values(due_at=now))
        assert await deliveries_store.release_next(conn, "ep_f", now) is None
        await conn.execute(
            update(deliveries).where(deliveries.c.id == ids[0]).values(status="delivered")
        )
        assert await deliveries_store.release_next(conn, "ep_f", now) is None  # ids[1] is due
        await conn.execute(
            update(deliveries).where(deliveries.c.id == ids[1]).values(status="delivered")
        )
        assert await deliveries_store.release_next(conn, "ep_f", now) == ids[2]
        assert await deliveries_store.release_next(conn, "ep_f", now) is None
    assert (await _statuses(db, ids))[2:] == [("pending", False), ("pending", True)]
