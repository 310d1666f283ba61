"""Durable execution on both backends: http, python and delay steps, retries, timeouts,
cancel in flight, lost workers. Retry timing is checked with a fake clock."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from flowhook.clock import FakeClock, SystemClock
from flowhook.engine.executor import Executor
from flowhook.engine.worker import Worker
from flowhook.service import Services
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, RunStatus, StepStatus
from tests.conftest import Api, Receiver


def flow(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "t", "steps": list(steps), **extra}


async def start(api: Api, definition: dict[str, Any], payload: dict[str, Any] | None = None) -> str:
    return await api.execute(await api.create_flow(definition), payload or {})


async def events_of(api: Api, run_id: str) -> list[dict[str, Any]]:
    return list((await api.get(f"/api/v1/flows/runs/{run_id}/events")).json()["data"])


async def test_http_step_templates_the_request_and_retries(api: Api, receiver: Receiver) -> None:
    receiver.script = [(503, {"busy": True})]
    receiver.default = (200, {"accepted": 7})
    run_id = await start(
        api,
        flow(
            {
                "id": "call",
                "type": "http",
                "request": {
                    "method": "POST",
                    "url": receiver.url + "/orders/{{ payload.order_id }}",
                    "headers": {"X-Order": "{{ payload.order_id }}"},
                    "query": {"n": "{{ payload.n }}"},
                    "json": {"total": "{{ payload.n * 2 }}"},
                },
                "retry": {"max_attempts": 3, "backoff_seconds": 0.05},
            },
            output={"accepted": "{{ steps.call.output.json.accepted }}"},
        ),
        {"order_id": "o7", "n": 4},
    )
    run = await api.wait(run_id)
    assert run["status"] == "completed", (run["error"], run["steps"])
    assert run["output"] == {"accepted": 7}
    [step] = run["steps"]
    assert (step["status"], step["attempts"]) == ("completed", 2)
    assert step["output"]["status_code"] == 200
    first, second = receiver.requests
    assert first["path"] == "/orders/o7?n=4"
    assert first["body"] == b'{"total":8}'
    assert first["headers"]["X-Order"] == "o7"
    assert (
        first["headers"]["Idempotency-Key"]
        == second["headers"]["Idempotency-Key"]
        == f"{run_id}:call"
    )
    names = [
        (e["event"], e["body"]["payload"].get("will_retry")) for e in await events_of(api, run_id)
    ]
    assert names[1:3] == [("flow.step_failed", True), ("flow.step_completed", None)]


async def test_non_2xx_fails_unless_accepted(api: Api, receiver: Receiver) -> None:
    receiver.default = (404, {"missing": True})
    failed = await api.wait(
        await start(api, flow({"id": "get", "type": "http", "request": {"url": receiver.url}}))
    )
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "http"
    assert failed["error"]["step"] == "get"
    ok = await api.wait(
        await start(
            api,
            flow(
                {
                    "id": "get",
                    "type": "http",
                    "request": {"url": receiver.url},
                    "accept_status": [404],
                }
            ),
        )
    )
    assert ok["status"] == "completed"
    assert ok["steps"][0]["output"]["json"] == {"missing": True}


async def test_step_timeout_fails_the_step(api: Api, receiver: Receiver) -> None:
    receiver.delay = 3
    run = await api.wait(
        await start(
            api,
            flow(
                {
                    "id": "slow",
                    "type": "http",
                    "request": {"url": receiver.url},
                    "timeout_seconds": 0.3,
                }
            ),
        )
    )
    assert run["status"] == "failed"
    assert run["error"]["type"] == "timeout"
    assert run["error"]["step"] == "slow"
    assert run["steps"][0]["status"] == "failed"


async def test_run_timeout_bounds_the_whole_run(api: Api) -> None:
    run = await api.wait(
        await start(api, flow({"id": "wait", "type": "delay", "seconds": 30}, timeout_seconds=0.5))
    )
    assert run["status"] == "failed"
    assert run["error"] == {"type": "timeout", "message": "run exceeded 0.5 s", "step": "wait"}


async def test_delay_releases_the_worker_and_resumes(api: Api, db: Database) -> None:
    run_id = await start(
        api,
        flow(
            {"id": "before", "type": "transform", "output": {"x": 1}},
            {"id": "wait", "type": "delay", "seconds": "{{ payload.s }}"},
            {
                "id": "after",
                "type": "transform",
                "output": {"y": "{{ steps.before.output.x + 1 }}"},
            },
        ),
        {"s": 1.0},
    )
    async with asyncio.timeout(10):  # the run asleep in its delay: an event, not a time
        while True:
            during = await _run(api, run_id)
            if any(s["status"] == "waiting" for s in during["steps"]):
                break
            await asyncio.sleep(0.02)
    assert during["status"] == "running"
    assert [(s["id"], s["status"]) for s in during["steps"]] == [
        ("before", "completed"),
        ("wait", "waiting"),
    ]
    async with db.read() as conn:
        raw = await runs_store.get_run_by_id(conn, run_id)
    assert raw is not None
    run = await api.wait(run_id)
    assert run["status"] == "completed"
    assert [s["status"] for s in run["steps"]] == ["completed"] * 3
    assert run["steps"][2]["output"] == {"y": 2}
    assert run["steps"][1]["duration_ms"] >= 900


async def test_cancel_during_a_delay_is_immediate(api: Api) -> None:
    run_id = await start(api, flow({"id": "wait", "type": "delay", "seconds": 60}))
    for _ in range(100):
        body = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
        if body["steps"]:
            break
        await asyncio.sleep(0.02)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert (r.status_code, r.json()["status"]) == (200, "cancelled")
    assert [e["event"] for e in await events_of(api, run_id)][-1] == "flow.cancelled"


async def test_a_cancel_that_meets_the_run_being_handed_back_still_cancels_it(api: Api) -> None:
    """A cancel right after execute races the worker handing the run back for its delay:
    the flag written just after the hand-back must not leave it asleep for the whole delay
    (on PostgreSQL it did, one cancel in a few)."""
    flow_id = await api.create_flow(
        {"name": "slow", "steps": [{"id": "z", "type": "delay", "seconds": 60}]}
    )
    for i in range(15):
        run_id = await api.execute(flow_id)
        await asyncio.sleep(0.005 * (i % 4))  # a few spots in the claim-to-hand-back window
        r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
        assert r.status_code in (200, 202), r.text
        assert (await api.wait(run_id, timeout=5))["status"] == "cancelled"


async def test_a_run_cancelled_while_asleep_reports_its_steps_and_duration(api: Api) -> None:
    run_id = await start(
        api,
        flow(
            {"id": "first", "type": "transform", "output": {"x": 1}},
            {"id": "wait", "type": "delay", "seconds": 60},
        ),
    )
    for _ in range(100):
        body = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
        if [s["status"] for s in body["steps"]] == ["completed", "waiting"]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"the run never slept in its delay: {body}")
    await asyncio.sleep(0.05)  # the run has lasted at least 50 ms
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert (r.status_code, r.json()["status"]) == (200, "cancelled")
    [cancelled] = [e for e in await events_of(api, run_id) if e["event"] == "flow.cancelled"]
    payload = cancelled["body"]["payload"]
    assert payload["status"] == "cancelled"
    assert payload["steps_executed"] == 1
    assert payload["duration_ms"] >= 50
    run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
    assert run["status"] == "cancelled"
    assert (run["steps_executed"], run["duration_ms"]) == (1, payload["duration_ms"])
    assert r.json()["duration_ms"] == payload["duration_ms"]


async def test_cancel_during_an_http_request_takes_effect_within_a_second(
    api: Api, receiver: Receiver
) -> None:
    receiver.delay = 20
    run_id = await start(
        api, flow({"id": "slow", "type": "http", "request": {"url": receiver.url}})
    )
    while not receiver.requests:
        await asyncio.sleep(0.02)
    asked = time.monotonic()
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert r.status_code == 202
    run = await api.wait(run_id, timeout=5)
    assert run["status"] == "cancelled"
    assert time.monotonic() - asked < 1.5
    events = [e["event"] for e in await events_of(api, run_id)]
    assert events == ["flow.started", "flow.cancelled"]


async def test_python_steps_call_registered_functions_only(api: Api) -> None:
    ok = await api.wait(
        await start(
            api,
            flow(
                {
                    "id": "calc",
                    "type": "python",
                    "function": "double",
                    "input": {"n": "{{ payload.n }}"},
                }
            ),
            {"n": 21, "order_id": "o1"},
        )
    )
    assert ok["status"] == "completed"
    assert ok["steps"][0]["output"] == {"value": 42, "order": "o1"}
    missing = await api.wait(
        await start(api, flow({"id": "x", "type": "python", "function": "os.system"}))
    )
    assert missing["status"] == "failed"
    assert "registered" in missing["error"]["message"]
    bad = await api.wait(
        await start(api, flow({"id": "x", "type": "python", "function": "not_json"}))
    )
    assert (bad["status"], bad["error"]["type"]) == ("failed", "output")
    number = await api.wait(
        await start(api, flow({"id": "n", "type": "python", "function": "answer"}))
    )  # a bare number as a step's output reads back (it failed every read on SQLite)
    assert number["status"] == "completed" and number["steps"][0]["output"] == 42, number


async def _setup(services: Services, definition: dict[str, Any], clock: FakeClock) -> str:
    created = await services.keys.create(Mode.TEST, "ws")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    f = await services.flows.create(who, definition)
    services.runs._clock = clock  # type: ignore[attr-defined]
    return (await services.runs.start(who, flow_id=f.flow_id, payload={})).run.run_id


async def _claim_and_run(db: Database, clock: FakeClock, owner: str = "w") -> RunStatus | None:
    now = clock.now()
    async with db.transaction() as conn:
        claimed = await runs_store.claim_runs(
            conn, owner=owner, now=now, lease_until=now + timedelta(seconds=30), limit=1
        )
    if not claimed:
        return None
    return await Executor(db, clock, owner).execute(claimed[0])


async def test_retry_backoff_follows_the_schedule_on_a_fake_clock(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    run_id = await _setup(
        services,
        flow(
            {
                "id": "f",
                "type": "python",
                "function": "flaky",
                "retry": {"max_attempts": 3, "backoff_seconds": [10, 60]},
            }
        ),
        clock,
    )
    assert await _claim_and_run(db, clock) is RunStatus.RUNNING  # attempt 1 fails
    async with db.read() as conn:
        run = await runs_store.get_run_by_id(conn, run_id)
    assert run is not None
    assert (run.steps[0].status, run.steps[0].attempts) == (StepStatus.RETRYING, 1)
    clock.advance(9.9)
    assert await _claim_and_run(db, clock) is None  # not due yet
    clock.advance(0.2)
    assert await _claim_and_run(db, clock) is RunStatus.RUNNING  # attempt 2 fails
    clock.advance(59)
    assert await _claim_and_run(db, clock) is None
    clock.advance(1.1)
    assert await _claim_and_run(db, clock) is RunStatus.COMPLETED  # attempt 3 succeeds
    async with db.read() as conn:
        done = await runs_store.get_run_by_id(conn, run_id)
    assert done is not None
    assert (done.steps[0].status, done.steps[0].attempts, done.steps[0].output) == (
        StepStatus.COMPLETED,
        3,
        {"attempt": 3},
    )


async def test_a_run_that_keeps_losing_its_worker_fails_worker_lost(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    run_id = await _setup(services, flow({"id": "a", "type": "transform", "output": {}}), clock)
    for i in range(5):  # five workers claim it and die
        now = clock.now()
        async with db.transaction() as conn:
            [_claimed] = await runs_store.claim_runs(
                conn, owner=f"dead{i}", now=now, lease_until=now + timedelta(seconds=30), limit=1
            )
        clock.advance(31)
    assert await _claim_and_run(db, clock) is RunStatus.FAILED
    async with db.read() as conn:
        run = await runs_store.get_run_by_id(conn, run_id)
    assert run is not None
    assert run.status is RunStatus.FAILED
    assert run.error is not None and run.error["type"] == "worker_lost"


async def test_flow_concurrency_caps_runs_in_flight(api: Api, receiver: Receiver) -> None:
    receiver.delay = 0.3
    in_flight = 0
    peak = 0
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
    flow_id = await api.create_flow(
        flow({"id": "call", "type": "http", "request": {"url": receiver.url}}, concurrency=2)
    )
    ids = [await api.execute(flow_id) for _ in range(6)]
    for run_id in ids:
        assert (await api.wait(run_id, timeout=15))["status"] == "completed"
    assert len(receiver.requests) == 6
    assert peak == 2


async def test_flow_concurrency_holds_across_workers(
    api: Api, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three workers (the app's and two more on the same database) take runs of one capped
    flow at once; the cap holds at every moment, not just on average. Every write of a run's
    progress is slowed, so a run admitted on a count that does not yet see another admitted
    run would show as a third request in flight."""
    real = runs_store.apply_progress

    async def slow(conn: Any, items: Any, *, owner: str, handoff: Any = None) -> list[bool]:
        await asyncio.sleep(0.03)
        return await real(conn, items, owner=owner, handoff=handoff)

    monkeypatch.setattr(runs_store, "apply_progress", slow)
    spans: list[tuple[float, float]] = []
    original = receiver.handle

    async def timed(request: Any) -> Any:
        begun = time.monotonic()
        try:
            return await original(request)
        finally:
            spans.append((begun, time.monotonic()))

    receiver.delay = 0.02
    receiver.handle = timed  # type: ignore[method-assign]
    services: Services = api.app.state.services
    flow_id = await api.create_flow(
        flow({"id": "call", "type": "http", "request": {"url": receiver.url}}, concurrency=2)
    )
    ids = [await api.execute(flow_id) for _ in range(40)]
    others = [
        Worker(services.db, SystemClock(), services.wakeup, allow_private_targets=True)
        for _ in range(2)
    ]
    for worker in others:
        await worker.start()
    try:
        for run_id in ids:
            assert (await api.wait(run_id, timeout=30))["status"] == "completed"
    finally:
        for worker in others:
            await worker.stop()
    assert len(spans) == 40
    moments = sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans])
    in_flight = peak = 0
    for _, step in moments:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak <= 2


async def _run(api: Api, run_id: str) -> dict[str, Any]:
    return dict((await api.get(f"/api/v1/flows/runs/{run_id}")).json())
