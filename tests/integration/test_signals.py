"""``wait`` steps and signals on both backends: broadcast and targeted signals, a signal that
comes before the run reaches its step, duplicates, timeouts each way, refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.clock import SystemClock
from flowhook.engine.worker import Worker
from flowhook.service import Services
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, RunStatus, StepStatus
from flowhook.store.tables import events
from tests.conftest import Api


def order_flow(**wait: Any) -> dict[str, Any]:
    step = {
        "id": "paid",
        "type": "wait",
        "signal": "order.paid",
        "match": {"order_id": "{{ payload.order_id }}"},
        **wait,
    }
    return {
        "name": "order",
        "timeout_seconds": 600,
        "steps": [
            step,
            {"id": "ship", "type": "transform", "output": {"paid": "{{ steps.paid.output }}"}},
        ],
        "output": {"paid": "{{ steps.ship.output.paid }}"},
    }


async def waiting(api: Api, run_id: str, step: str = "paid") -> dict[str, Any]:
    """The run once step ``step`` is waiting."""
    async with asyncio.timeout(10):
        while True:
            run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
            if any(s["id"] == step and s["status"] == "waiting" for s in run["steps"]):
                return dict(run)
            assert run["status"] in ("queued", "running"), run
            await asyncio.sleep(0.02)


async def signal(
    api: Api, name: str, data: dict[str, Any], who: str = "test", **extra: Any
) -> dict[str, Any]:
    r = await api.post("/api/v1/signals", {"name": name, "data": data, **extra}, who=who)
    assert r.status_code == 202, r.text
    return dict(r.json())


async def test_a_broadcast_signal_resumes_the_runs_it_matches(api: Api) -> None:
    flow_id = await api.create_flow(order_flow(timeout_seconds=300))
    first = await api.execute(flow_id, {"order_id": "o1"})
    second = await api.execute(flow_id, {"order_id": "o2"})
    run = await waiting(api, first)
    await waiting(api, second)
    [step] = [s for s in run["steps"] if s["id"] == "paid"]
    assert step["output"]["signal"] == "order.paid"
    assert step["output"]["match"] == {"order_id": "o1"}
    assert step["output"]["until"].endswith("Z")

    sent = await signal(api, "order.paid", {"order_id": "o1", "amount": 42})
    assert sent["id"].startswith("sig_") and sent["matched"] == 1 and sent["run_id"] is None
    done = await api.wait(first)
    assert done["status"] == "completed", done
    paid = done["output"]["paid"]
    assert (paid["signal"], paid["id"], paid["data"]) == (
        "order.paid",
        sent["id"],
        {"order_id": "o1", "amount": 42},
    )
    assert paid["received_at"] == sent["created_at"]
    assert (await waiting(api, second))["status"] == "running"  # o2 still waits
    assert (await signal(api, "order.paid", {"order_id": 3}))["matched"] == 0  # no match
    assert (await signal(api, "order.shipped", {"order_id": "o2"}))["matched"] == 0
    assert (await signal(api, "order.paid", {"order_id": "o2"}, who="other"))["matched"] == 0
    assert (await signal(api, "order.paid", {"order_id": "o2"}))["matched"] == 1
    assert (await api.wait(second))["status"] == "completed"


async def test_a_signal_to_one_run_ignores_match_and_a_finished_run_refuses_it(api: Api) -> None:
    flow_id = await api.create_flow(order_flow())
    run_id = await api.execute(flow_id, {"order_id": "o1"})
    await waiting(api, run_id)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/signal", {"name": "order.paid", "data": {}})
    assert r.status_code == 202 and r.json()["matched"] == 1 and r.json()["run_id"] == run_id
    done = await api.wait(run_id)
    assert done["status"] == "completed" and done["output"]["paid"]["data"] == {}
    again = await api.post(f"/api/v1/flows/runs/{run_id}/signal", {"name": "order.paid"})
    assert again.status_code == 409 and again.json()["code"] == "run_finished"
    unknown = await api.post("/api/v1/flows/runs/run_nope/signal", {"name": "order.paid"})
    assert unknown.status_code == 404
    other = await api.post(f"/api/v1/flows/runs/{run_id}/signal", {"name": "x"}, who="other")
    assert other.status_code == 404


async def test_a_signal_sent_before_the_run_reaches_its_wait_still_counts(api: Api) -> None:
    """The race a fast sender and a slow run would lose: the signal comes while the run is
    still in an earlier step. A signal sent before the run was queued does not count."""
    flow = order_flow(timeout_seconds=0.5, on_timeout="continue")
    flow["steps"].insert(0, {"id": "slow", "type": "delay", "seconds": 0.4})
    flow_id = await api.create_flow(flow)
    stale = await signal(api, "order.paid", {"order_id": "early"})
    assert stale["matched"] == 0
    late = await api.execute(flow_id, {"order_id": "early"})
    run_id = await api.execute(flow_id, {"order_id": "o9"})
    sent = await signal(api, "order.paid", {"order_id": "o9"})
    assert sent["matched"] == 0  # nobody waits yet
    r = await api.post(f"/api/v1/flows/runs/{late}/signal", {"name": "other", "data": {}})
    assert r.status_code == 202 and r.json()["matched"] == 0
    done = await api.wait(run_id)
    assert done["status"] == "completed" and done["output"]["paid"]["id"] == sent["id"]
    timed_out = await api.wait(late)  # the stale signal was not taken: its wait timed out
    assert timed_out["status"] == "completed" and timed_out["output"]["paid"] is None


async def test_a_matching_signal_behind_many_others_of_its_name_is_found(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More signals of the name than one read takes (other orders paid while this run was
    in an earlier step): the run still finds its own, on a later page."""
    from flowhook.store import signals as signals_store

    monkeypatch.setattr(signals_store, "PAGE", 2)
    flow = order_flow(timeout_seconds=5)
    flow["steps"].insert(0, {"id": "slow", "type": "delay", "seconds": 0.5})
    flow_id = await api.create_flow(flow)
    run_id = await api.execute(flow_id, {"order_id": "o7"})
    for n in range(5):  # two and a half pages of other orders, then this one's
        assert (await signal(api, "order.paid", {"order_id": f"other-{n}"}))["matched"] == 0
    mine = await signal(api, "order.paid", {"order_id": "o7"})
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    assert done["output"]["paid"]["id"] == mine["id"]


async def test_a_signal_to_one_run_before_it_reaches_its_wait_is_kept_for_it(api: Api) -> None:
    """A targeted signal waits for its run's ``wait`` step, whatever its data."""
    flow = order_flow(timeout_seconds=5)
    flow["steps"].insert(0, {"id": "slow", "type": "delay", "seconds": 0.4})
    flow_id = await api.create_flow(flow)
    run_id = await api.execute(flow_id, {"order_id": "o8"})
    r = await api.post(
        f"/api/v1/flows/runs/{run_id}/signal", {"name": "order.paid", "data": {"psp": "x"}}
    )
    assert r.status_code == 202 and r.json()["matched"] == 0, r.text
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    assert done["output"]["paid"]["id"] == r.json()["id"]
    assert done["output"]["paid"]["data"] == {"psp": "x"}


async def test_a_waiting_run_holds_no_worker_and_is_not_claimed_again(api: Api) -> None:
    """While it waits the run has no lease, falls due only when its time is up (the wait's
    hour or, earlier, the flow's 600 s), and no claim takes it meanwhile (nothing polls it)."""
    from flowhook.store.tables import runs

    flow_id = await api.create_flow(order_flow(timeout_seconds=3600))
    run_id = await api.execute(flow_id, {"order_id": "o5"})
    await waiting(api, run_id)
    db: Database = api.app.state.services.db

    async def row() -> Any:
        async with db.read() as conn:
            q = select(runs.c.lease_owner, runs.c.claims, runs.c.due_at)
            return (await conn.execute(q.where(runs.c.run_id == run_id))).one()

    before = await row()
    await asyncio.sleep(0.5)
    after = await row()
    assert before.lease_owner is None and after.lease_owner is None
    assert after.claims == before.claims  # not claimed again while it waits
    due = after.due_at if after.due_at.tzinfo else after.due_at.replace(tzinfo=UTC)
    assert due > datetime.now(UTC) + timedelta(minutes=9)  # when the flow's 600 s are up
    assert (await signal(api, "order.paid", {"order_id": "o5"}))["matched"] == 1
    assert (await api.wait(run_id))["status"] == "completed"


async def test_the_same_signal_id_twice_is_one_signal(api: Api) -> None:
    flow = order_flow()
    flow["steps"].insert(1, {**flow["steps"][0], "id": "paid_again"})
    flow_id = await api.create_flow(flow)
    run_id = await api.execute(flow_id, {"order_id": "o1"})
    await waiting(api, run_id)
    first = await signal(api, "order.paid", {"order_id": "o1"}, id="psp-evt-1")
    assert first["matched"] == 1
    await waiting(api, run_id, "paid_again")  # one signal resumes one wait step of a run
    again = await signal(api, "order.paid", {"order_id": "o1"}, id="psp-evt-1")
    assert (again["id"], again["matched"]) == (first["id"], 0)
    await asyncio.sleep(0.3)
    assert (await waiting(api, run_id, "paid_again"))["status"] == "running"
    second = await signal(api, "order.paid", {"order_id": "o1"}, id="psp-evt-2")
    assert second["matched"] == 1
    done = await api.wait(run_id)
    assert done["status"] == "completed"
    steps = {s["id"]: s["output"]["id"] for s in done["steps"] if s["type"] == "wait"}
    assert steps == {"paid": first["id"], "paid_again": second["id"]}


async def test_a_wait_that_times_out_fails_or_continues(api: Api) -> None:
    failing = await api.create_flow(order_flow(timeout_seconds=0.3))
    failed = await api.wait(await api.execute(failing, {"order_id": "o1"}))
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "wait_timeout" and failed["error"]["step"] == "paid"
    assert "'order.paid'" in failed["error"]["message"]
    assert [s["status"] for s in failed["steps"]] == ["failed"]
    going_on = await api.create_flow(order_flow(timeout_seconds=0.3, on_timeout="continue"))
    done = await api.wait(await api.execute(going_on, {"order_id": "o1"}))
    assert done["status"] == "completed" and done["output"] == {"paid": None}
    # a signal after the timeout resumes nothing
    assert (await signal(api, "order.paid", {"order_id": "o1"}))["matched"] == 0


async def test_a_cancelled_waiting_run_is_not_matched(api: Api) -> None:
    flow_id = await api.create_flow(order_flow())
    run_id = await api.execute(flow_id, {"order_id": "o1"})
    await waiting(api, run_id)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"  # nobody held it
    assert (await signal(api, "order.paid", {"order_id": "o1"}))["matched"] == 0


async def test_refusals(api: Api) -> None:
    r = await api.post("/api/v1/flows", {"name": "x", "steps": [{"id": "w", "type": "wait"}]})
    assert r.status_code == 400 and "signal" in r.json()["error"], r.text
    bad_timeout = {"id": "w", "type": "wait", "signal": "s", "on_timeout": "approve"}
    r = await api.post("/api/v1/flows", {"name": "x", "steps": [bad_timeout]})
    assert r.status_code == 400 and "on_timeout" in r.json()["error"], r.text
    for body in (
        {},
        {"name": ""},
        {"name": "x" * 201},
        {"name": "a", "data": [1]},
        {"name": "a", "id": ""},
        {"name": "a", "extra": 1},
    ):
        r = await api.post("/api/v1/signals", body)
        assert r.status_code in (400, 422) and "error" in r.json(), (body, r.text)


async def test_an_inbound_hook_sends_a_signal_that_resumes_a_wait(api: Api) -> None:
    """A hook created with ``signal`` instead of ``flow_id``: each accepted arrival's body is
    the signal's data; a delivery id seen before is the same signal; the events say so."""
    flow_id = await api.create_flow(order_flow())
    run_id = await api.execute(flow_id, {"order_id": "o1"})
    other = await api.execute(flow_id, {"order_id": "o2"})
    r = await api.post("/api/v1/hooks", {"signal": "order.paid", "dedup_header": "X-Delivery"})
    assert r.status_code == 201, r.text
    h = r.json()
    assert (h["signal"], h["flow_id"]) == ("order.paid", None)
    await waiting(api, run_id)
    path = "/api/v1/hooks/" + h["id"]
    headers = {"X-Delivery": "psp-1"}
    first = await api.client.post(path, json={"order_id": "o1", "amount": 9}, headers=headers)
    assert first.status_code == 202, first.text
    sent = first.json()
    assert sent["signal_id"].startswith("sig_")
    assert (sent["signal"], sent["matched"], sent["duplicate"]) == ("order.paid", 1, False)
    done = await api.wait(run_id)
    assert done["status"] == "completed"
    assert done["output"]["paid"]["id"] == sent["signal_id"]
    assert done["output"]["paid"]["data"] == {"order_id": "o1", "amount": 9}
    # The provider's retry of the same delivery is the same signal, and resumes nothing.
    again = await api.client.post(path, json={"order_id": "o2"}, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json() == {**sent, "matched": 0, "duplicate": True}
    assert (await waiting(api, other))["status"] == "running"
    delivered = (await api.get("/api/v1/events", params={"event": "webhook.delivered"})).json()
    payloads = [e["body"]["payload"] for e in delivered["data"]]
    assert {(p["accepted"], p["reason"], p["signal_id"]) for p in payloads} == {
        (True, None, sent["signal_id"]),
        (False, "duplicate delivery id", sent["signal_id"]),
    }
    received = (await api.get("/api/v1/events", params={"event": "webhook.received"})).json()
    [event] = received["data"]
    assert event["body"]["payload"] == {
        "hook_id": h["id"], "signal": "order.paid", "signal_id": sent["signal_id"], "matched": 1,
    }  # fmt: skip
    # A form body is data too; a rotated hook keeps sending the same signal.
    rotated = (await api.post(f"/api/v1/hooks/{h['id']}/rotate")).json()
    assert rotated["signal"] == "order.paid"
    form = await api.client.post(
        "/api/v1/hooks/" + rotated["id"],
        content=b"order_id=o2",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert form.status_code == 202 and form.json()["matched"] == 1, form.text
    assert (await api.wait(other))["output"]["paid"]["data"] == {"order_id": "o2"}


async def test_a_hook_names_a_flow_or_a_signal(api: Api) -> None:
    flow_id = await api.create_flow(order_flow())
    for body, field in (
        ({}, "flow_id"),
        ({"flow_id": flow_id, "signal": "order.paid"}, "signal"),
        ({"signal": ""}, "signal"),
        ({"signal": "x" * 201}, "signal"),
        ({"signal": "bad\nname"}, "signal"),
    ):
        r = await api.post("/api/v1/hooks", body)
        assert r.status_code in (400, 422), (body, r.text)
        assert field in r.json()["error"], (body, r.text)


async def test_a_resumed_wait_whose_next_write_is_lost_takes_the_same_signal_again(
    services: Services, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``wait`` step resumed by a signal is not committed on its own (the signal is stored
    as the step's); when the write after it is lost, the run is resumed, finds the same
    signal again, and raises the step's event once."""
    created = await services.keys.create(Mode.TEST, "ws")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    flow = await services.flows.create(who, order_flow())
    run_id = (
        await services.runs.start(who, flow_id=flow.flow_id, payload={"order_id": "o1"})
    ).run.run_id
    worker = Worker(db, SystemClock(), services.wakeup, lease_seconds=30)
    assert await worker.run_once() == 1
    await worker.drain()
    sent = await services.signals.send(who, "order.paid", {"order_id": "o1"})
    assert sent.matched == 1
    real, lost = runs_store.apply_progress, []

    async def apply_progress(
        conn: AsyncConnection,
        items: Sequence[runs_store.Progress],
        *,
        owner: str,
        handoff: Any = None,
    ) -> list[bool]:
        if not lost:
            lost.append([item.steps for item in items])
            raise RuntimeError("the database went away")
        return await real(conn, items, owner=owner, handoff=handoff)

    monkeypatch.setattr(runs_store, "apply_progress", apply_progress)
    assert await worker.run_once() == 1
    await worker.drain()
    [[steps]] = lost  # the write that was lost held the wait step's result too
    assert [(s.step_id, s.status) for s in steps] == [
        ("paid", StepStatus.COMPLETED),
        ("ship", StepStatus.COMPLETED),
    ]
    assert await worker.run_once() == 1
    await worker.drain()
    run = await services.runs.get(who, run_id)
    assert run.status is RunStatus.COMPLETED
    assert run.output["paid"]["id"] == sent.signal.id
    async with db.read() as conn:
        completed = (
            await conn.execute(
                select(func.count())
                .select_from(events)
                .where(events.c.run_id == run_id, events.c.type == "flow.step_completed")
            )
        ).scalar_one()
    assert completed == 2  # paid and ship, once each
