"""Pausing a webhook endpoint (both backends): its pending deliveries and those queued while
it is paused wait, attempted by no one and using no attempts, each saying why; other
endpoints go on; resume sends them oldest first, a retry keeping its time; a delivery that
fell due while the pause was on its way is put back, not sent; the API's pause and resume
answer 404 for endpoints that are not the caller's."""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa

from flowhook.clock import FakeClock
from flowhook.service import Services
from flowhook.store import pausing
from flowhook.store.db import Database
from flowhook.store.types import HELD
from tests.conftest import Api, Receiver
from tests.integration.test_dispatcher import dispatcher, pump, raise_event, setup


def order_of(requests: list[dict[str, Any]], path: str) -> list[str]:
    """The run ids of the requests to ``path``, in the order they came."""
    import orjson

    return [orjson.loads(r["body"])["run_id"] for r in requests if r["path"] == path]


async def test_a_paused_endpoint_holds_its_deliveries_until_resumed_then_sends_oldest_first(
    services: Services, db: Database, receiver: Receiver
) -> None:
    clock = FakeClock()
    who, [paused_ep, _] = await setup(services, clock, [f"{receiver.url}/p", f"{receiver.url}/o"])
    await raise_event(db, who, clock, n=2)  # run_0, run_1: pending before the pause
    endpoint = await services.webhooks.pause_endpoint(who, paused_ep)
    assert endpoint.paused_at == clock.now()
    again = await services.webhooks.pause_endpoint(who, paused_ep)  # changes nothing
    assert again.paused_at == endpoint.paused_at
    clock.advance(1)
    await raise_event(db, who, clock, n=3)  # run_0..run_2 again: queued while paused
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 5  # the other endpoint's five, none of the paused one's
        assert {r["path"] for r in receiver.requests} == {"/o"}
        clock.advance(3600)
        assert await pump(d) == 0
        page = await services.webhooks.list_deliveries(
            who, limit=10, cursor=None, endpoint_id=paused_ep
        )
        assert len(page.data) == 5
        for held in page.data:
            assert (held.status, held.attempts, held.next_attempt_at) == ("pending", 0, HELD)
            assert held.waiting_for == {"reason": "paused", "since": endpoint.paused_at}
        one, _ = await services.webhooks.get_delivery(who, page.data[0].id)
        assert one.attempt_log == [] and one.waiting_for is not None

        resumed = await services.webhooks.resume_endpoint(who, paused_ep)
        assert resumed.paused_at is None
        assert await pump(d) == 5
    finally:
        await d.stop()
    sent = order_of(receiver.requests, "/p")
    assert sent == ["run_0", "run_1", "run_0", "run_1", "run_2"]  # oldest first
    page = await services.webhooks.list_deliveries(
        who, limit=10, cursor=None, endpoint_id=paused_ep
    )
    assert [(x.status, x.attempts, x.waiting_for) for x in page.data] == [
        ("succeeded", 1, None)
    ] * 5


async def test_a_retry_held_by_a_pause_keeps_its_time_and_its_attempt_count(
    services: Services, db: Database, receiver: Receiver
) -> None:
    receiver.script = [(500, {})]
    clock = FakeClock()
    who, [ep] = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock)
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 1  # attempt 1 fails: the retry is due in about 30 s
        await services.webhooks.pause_endpoint(who, ep)
        clock.advance(5)
        await services.webhooks.resume_endpoint(who, ep)  # before the retry's time
        assert await pump(d) == 0
        await services.webhooks.pause_endpoint(who, ep)
        clock.advance(60)  # the retry's time passes while paused
        assert await pump(d) == 0
        await services.webhooks.resume_endpoint(who, ep)
        assert await pump(d) == 1  # due at once now
    finally:
        await d.stop()
    [delivery] = (await services.webhooks.list_deliveries(who, limit=5, cursor=None)).data
    assert (delivery.status, delivery.attempts) == ("succeeded", 2)
    assert len(receiver.requests) == 2


async def test_a_delivery_claimed_while_its_endpoint_is_paused_is_put_back_unattempted(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """The fan-out read the endpoint before the pause committed, so its delivery was queued
    due: the claim reads the pause and puts it back, no attempt counted or logged."""
    clock = FakeClock()
    who, [ep] = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock)  # queued due, before the pause
    async with db.transaction() as conn:  # the pause's mark alone: its hold has not run
        assert await pausing.mark_endpoint(conn, who.workspace_id, who.mode, ep, clock.now())
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 1  # claimed, then put back
        assert receiver.requests == []
        [held] = (await services.webhooks.list_deliveries(who, limit=5, cursor=None)).data
        one, _ = await services.webhooks.get_delivery(who, held.id)
        assert (one.attempts, one.attempt_log, one.next_attempt_at) == (0, [], HELD)
        assert one.waiting_for is not None and one.waiting_for["reason"] == "paused"
        await services.webhooks.resume_endpoint(who, ep)
        assert await pump(d) == 1
    finally:
        await d.stop()
    one, _ = await services.webhooks.get_delivery(who, held.id)
    assert (one.status, one.attempts, [a.number for a in one.attempt_log]) == ("succeeded", 1, [1])
    assert len(receiver.requests) == 1


async def test_a_put_back_finding_the_endpoint_resumed_lets_the_attempt_go(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    _, [ep] = await setup(services, clock, ["http://127.0.0.1:9/"])
    async with db.transaction() as conn:
        assert not await pausing.put_back(conn, "dlv_x", ep, 1, "d1")  # not paused: it goes


async def test_a_fifo_endpoints_followers_say_which_delivery_is_ahead(
    services: Services, db: Database, receiver: Receiver
) -> None:
    receiver.default = (500, {})
    clock = FakeClock()
    who, [ep] = await setup(services, clock, [receiver.url])
    await services.webhooks.update_endpoint(who, ep, {"ordering": "fifo"})
    await raise_event(db, who, clock, n=3)
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 1  # the first fails: the others wait behind it
    finally:
        await d.stop()
    page = await services.webhooks.list_deliveries(who, limit=5, cursor=None)
    first = min(page.data, key=lambda x: x.id)
    assert first.waiting_for is None and first.attempts == 1
    followers = [x for x in page.data if x.id != first.id]
    assert [x.waiting_for for x in followers] == [{"reason": "fifo", "delivery_id": first.id}] * 2
    await services.webhooks.pause_endpoint(who, ep)  # paused: the reason every one waits
    page = await services.webhooks.list_deliveries(who, limit=5, cursor=None)
    assert {x.waiting_for["reason"] for x in page.data if x.waiting_for} == {"paused"}
    assert len([x for x in page.data if x.waiting_for]) == 3


# --- over the API, with the engine's hand-off and dispatcher in the app ---------------------

NOTIFY = {"name": "notify", "steps": [{"id": "t", "type": "transform", "output": {"ok": True}}]}


async def test_pause_and_resume_over_the_api(api: Api, receiver: Receiver) -> None:
    r = await api.post(
        "/api/v1/webhooks/endpoints", {"url": receiver.url, "events": ["flow.completed"]}
    )
    assert r.status_code == 201, r.text
    ep = r.json()["id"]
    assert r.json()["paused"] is False and r.json()["paused_at"] is None
    r = await api.post(f"/api/v1/webhooks/endpoints/{ep}/pause")
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is True and r.json()["paused_at"].endswith("Z")
    flow_id = await api.create_flow(NOTIFY)
    runs = [await api.execute(flow_id, {"n": n}) for n in range(3)]
    for run_id in runs:
        assert (await api.wait(run_id))["status"] == "completed"
    held: list[dict[str, Any]] = []
    async with asyncio.timeout(15):
        while len(held) < 3:
            r = await api.get(f"/api/v1/webhooks/deliveries?endpoint_id={ep}")
            held = [x for x in r.json()["data"] if x["waiting_for"]]
            await asyncio.sleep(0.02)
    for x in held:
        assert x["status"] == "pending" and x["attempts"] == 0 and x["next_attempt_at"] is None
        assert x["waiting_for"] == {
            "reason": "paused",
            "since": r.json()["data"][0]["waiting_for"]["since"],
        }
    assert receiver.requests == []
    r = await api.get(f"/api/v1/webhooks/endpoints/{ep}")
    assert r.json()["paused"] is True
    r = await api.post(f"/api/v1/webhooks/endpoints/{ep}/resume")
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is False
    async with asyncio.timeout(15):
        while len(receiver.requests) < 3:
            await asyncio.sleep(0.02)
    assert sorted(order_of(receiver.requests, "/")) == sorted(runs)


async def test_endpoint_pause_and_resume_answer_404_for_endpoints_not_the_callers(
    api: Api, receiver: Receiver
) -> None:
    r = await api.post(
        "/api/v1/webhooks/endpoints", {"url": receiver.url, "events": ["flow.completed"]}
    )
    ep = r.json()["id"]
    for action in ("pause", "resume"):
        for who in ("live", "other"):
            r = await api.post(f"/api/v1/webhooks/endpoints/{ep}/{action}", who=who)
            assert r.status_code == 404, r.text
        for bad in ("ep_nope", "nope", "wf_01m8jykh1yeksbzqqg2qeymgmx"):
            r = await api.post(f"/api/v1/webhooks/endpoints/{bad}/{action}")
            assert r.status_code == 404, r.text
    r = await api.get(f"/api/v1/webhooks/endpoints/{ep}")
    assert r.json()["paused"] is False


async def test_deleting_a_paused_endpoint_fails_what_it_held_instead_of_keeping_it_forever(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who, [ep] = await setup(services, clock, ["http://127.0.0.1:9/"])
    await services.webhooks.update_endpoint(who, ep, {"ordering": "fifo"})
    await services.webhooks.pause_endpoint(who, ep)
    await raise_event(db, who, clock, n=2)  # held: paused, and the second behind the first
    await services.webhooks.delete_endpoint(who, ep)
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 2
    finally:
        await d.stop()
    page = await services.webhooks.list_deliveries(who, limit=5, cursor=None)
    assert [x.status for x in page.data] == ["failed", "failed"]


async def test_a_pause_takes_back_a_lease_that_ran_out_so_its_holder_cannot_send(
    services: Services, db: Database
) -> None:
    """A process claimed a delivery and went quiet past its lease: the pause holds the
    delivery and takes the lease back, so that process can neither renew nor send it."""
    from datetime import timedelta

    from flowhook.store import delivery_queue

    clock = FakeClock()
    who, [ep] = await setup(services, clock, ["http://127.0.0.1:9/"])
    await raise_event(db, who, clock)
    async with db.transaction() as conn:
        [claimed] = await delivery_queue.claim_deliveries(
            conn, owner="gone", now=clock.now(), lease_until=clock.now() + timedelta(seconds=5),
            limit=5, per_endpoint=5,
        )  # fmt: skip
    clock.advance(10)  # its lease ran out
    await services.webhooks.pause_endpoint(who, ep)
    async with db.transaction() as conn:
        renewed = await delivery_queue.renew_delivery_lease(
            conn, claimed.id, owner="gone", until=clock.now() + timedelta(seconds=5)
        )
    assert renewed is False
    one, _ = await services.webhooks.get_delivery(who, claimed.id)
    assert one.next_attempt_at == HELD and one.waiting_for is not None


async def test_a_replay_to_a_paused_endpoint_is_answered_held(
    services: Services, db: Database, receiver: Receiver
) -> None:
    clock = FakeClock()
    who, [ep] = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock)
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 1
    finally:
        await d.stop()
    [sent] = (await services.webhooks.list_deliveries(who, limit=5, cursor=None)).data
    paused = await services.webhooks.pause_endpoint(who, ep)
    copy = await services.webhooks.replay(who, sent.id)
    assert copy.next_attempt_at == HELD
    assert copy.waiting_for == {"reason": "paused", "since": paused.paused_at}


async def test_the_pause_time_is_stored_as_every_time_is(
    services: Services, db: Database, database_url: str
) -> None:
    """On SQLite times are integer microseconds; the pause's kept time too (a coalesce of a
    plain datetime once wrote text)."""
    clock = FakeClock()
    who, [ep] = await setup(services, clock, ["http://127.0.0.1:9/"])
    await services.webhooks.pause_endpoint(who, ep)
    await services.webhooks.pause_endpoint(who, ep)
    if database_url.startswith("sqlite"):
        async with db.read() as conn:
            kind = (
                await conn.execute(sa.text("SELECT typeof(paused_at) FROM webhook_endpoints"))
            ).scalar()
        assert kind == "integer"
    assert (await services.webhooks.get_endpoint(who, ep)).paused_at == clock.now()
