"""Interrupted work on both backends: a step attempt or a webhook attempt cut short by a
crash shows as interrupted, and work claimed again after its lease ended is taken in the
order it fell due, not behind what was queued meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

import aiohttp

import tests.plugins  # noqa: F401 - registers the python steps used here
from flowhook.clock import FakeClock
from flowhook.engine.executor import Executor
from flowhook.service import Principal, Services
from flowhook.store import delivery_queue
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, RunStatus, StepStatus
from tests.conftest import Api, Receiver
from tests.integration.test_dispatcher import dispatcher, pump, raise_event, setup

LEASE = timedelta(seconds=30)


def flow(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "t", "steps": list(steps)}


async def _principal(services: Services, clock: FakeClock) -> Principal:
    created = await services.keys.create(Mode.TEST, "ws")
    services.runs._clock = clock  # type: ignore[attr-defined]
    return await services.keys.authenticate(f"Bearer {created.key}")


async def _start(services: Services, who: Principal, definition: dict[str, Any]) -> str:
    f = await services.flows.create(who, definition)
    return (await services.runs.start(who, flow_id=f.flow_id, payload={})).run.run_id


async def _claim(db: Database, clock: FakeClock, owner: str, limit: int = 1) -> list[Any]:
    now = clock.now()
    async with db.transaction() as conn:
        return await runs_store.claim_runs(
            conn, owner=owner, now=now, lease_until=now + LEASE, limit=limit
        )


async def _steps(db: Database, run_id: str) -> list[Any]:
    async with db.read() as conn:
        run = await runs_store.get_run_by_id(conn, run_id)
    assert run is not None
    return run.steps


async def _crash_mid_step(db: Database, clock: FakeClock, run_id: str, owner: str) -> None:
    """Claim the run as ``owner`` and stop that worker while its step is in flight (the
    task is cancelled as on a shutdown that never finishes: nothing more is written)."""
    [run] = await _claim(db, clock, owner)
    executor = Executor(db, clock, owner)
    task = asyncio.create_task(executor.execute(run))
    while run_id not in executor.in_step:
        assert not task.done(), task.result()
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_an_attempt_cut_short_by_a_crash_counts_and_shows_interrupted(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who = await _principal(services, clock)
    run_id = await _start(
        services,
        who,
        flow(
            {"id": "before", "type": "transform", "output": {"v": 1}},
            {"id": "call", "type": "python", "function": "stall_once"},
        ),
    )
    await _crash_mid_step(db, clock, run_id, "dead")
    before, call = await _steps(db, run_id)  # the attempt's start was committed before it ran
    assert (before.status, call.status, call.attempts) == (
        StepStatus.COMPLETED,
        StepStatus.RUNNING,
        1,
    )
    clock.advance(LEASE.total_seconds() + 1)
    [run] = await _claim(db, clock, "next")
    assert await Executor(db, clock, "next").execute(run) is RunStatus.COMPLETED
    [_, call] = await _steps(db, run_id)
    assert (call.status, call.attempts, call.interrupted) == (StepStatus.COMPLETED, 2, (1,))
    assert call.output == {"attempt": 2}
    record = await services.runs.get(who, run_id)
    body = record.steps[1]
    assert (body.attempts, body.interrupted) == (2, (1,))


async def test_the_run_record_shows_the_step_in_flight(api: Api, receiver: Receiver) -> None:
    receiver.delay = 20
    flow_id = await api.create_flow(
        flow({"id": "slow", "type": "http", "request": {"url": receiver.url}})
    )
    run_id = await api.execute(flow_id)
    while not receiver.requests:
        await asyncio.sleep(0.02)
    run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
    [step] = run["steps"]
    assert (step["id"], step["status"], step["attempts"], step["interrupted_attempts"]) == (
        "slow",
        "running",
        1,
        [],
    )
    assert (await api.post(f"/api/v1/flows/runs/{run_id}/cancel")).status_code == 202
    run = await api.wait(run_id, timeout=5)
    [step] = run["steps"]
    assert (run["status"], step["status"], step["interrupted_attempts"]) == (
        "cancelled",
        "failed",
        [1],
    )
    assert step["error"]["type"] == "cancelled"


async def test_a_run_that_loses_its_worker_too_often_marks_every_attempt_interrupted(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who = await _principal(services, clock)
    run_id = await _start(
        services, who, flow({"id": "call", "type": "python", "function": "stall_once"})
    )
    await _crash_mid_step(db, clock, run_id, "dead")
    for i in range(4):  # four more workers claim it and die before they start the step
        clock.advance(LEASE.total_seconds() + 1)
        await _claim(db, clock, f"dead{i}")
    clock.advance(LEASE.total_seconds() + 1)
    [run] = await _claim(db, clock, "last")
    assert await Executor(db, clock, "last").execute(run) is RunStatus.FAILED
    [call] = await _steps(db, run_id)
    assert (call.status, call.attempts, call.interrupted) == (StepStatus.FAILED, 1, (1,))
    assert call.error is not None and call.error["type"] == "worker_lost"


async def test_two_external_steps_in_a_row_take_no_extra_commit(
    services: Services, db: Database, receiver: Receiver
) -> None:
    """The start of the second step rides in the commit of the first one's result: a run of
    two http steps writes four times (start+1st, result+2nd, result, end), as before."""
    clock = FakeClock()
    who = await _principal(services, clock)
    call = {"type": "http", "request": {"url": receiver.url}}
    run_id = await _start(services, who, flow({"id": "a", **call}, {"id": "b", **call}))
    writes: list[list[tuple[str, str]]] = []
    [run] = await _claim(db, clock, "w")

    async def apply(progress: runs_store.Progress) -> bool:
        writes.append([(s.step_id, str(s.status)) for s in progress.steps])
        async with db.transaction() as conn:
            [ok] = await runs_store.apply_progress(conn, [progress], owner="w")
        return ok

    async with aiohttp.ClientSession() as http:
        executor = Executor(db, clock, "w", http=http, allow_private_targets=True, apply=apply)
        assert await executor.execute(run) is RunStatus.COMPLETED
    assert writes == [
        [("a", "running")],
        [("a", "completed"), ("b", "running")],
        [("b", "completed")],
        [],
    ]
    assert [s.attempts for s in await _steps(db, run_id)] == [1, 1]


async def test_a_run_claimed_again_after_its_lease_goes_before_newer_runs(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who = await _principal(services, clock)
    definition = flow({"id": "a", "type": "transform", "output": {}})
    old = await _start(services, who, definition)
    await _claim(db, clock, "dead")  # its worker dies; heartbeats ran meanwhile
    async with db.transaction() as conn:
        await runs_store.extend_leases(
            conn, owner="dead", run_ids=[old], until=clock.now() + 2 * LEASE
        )
    clock.advance(5)
    newer = [await _start(services, who, definition) for _ in range(3)]
    clock.advance(2 * LEASE.total_seconds())
    assert [r.run_id for r in await _claim(db, clock, "w")] == [old]
    assert sorted(r.run_id for r in await _claim(db, clock, "w", limit=3)) == sorted(newer)


async def test_a_delivery_cut_short_shows_its_attempt_interrupted(
    services: Services, db: Database, receiver: Receiver
) -> None:
    clock = FakeClock()
    who, _ = await setup(services, clock, [receiver.url])
    await raise_event(db, who, clock)
    now = clock.now()
    async with db.transaction() as conn:  # a process claims it and dies mid-attempt
        [dead] = await delivery_queue.claim_deliveries(
            conn, owner="dead", now=now, lease_until=now + LEASE, limit=8, per_endpoint=8
        )
    clock.advance(LEASE.total_seconds() + 1)
    d = dispatcher(db, clock)
    await d.open()
    try:
        assert await pump(d) == 1
    finally:
        await d.stop()
    delivery, _ = await services.webhooks.get_delivery(who, dead.id)
    first, second = delivery.attempt_log
    assert (first.number, first.error_class, first.finished_at) == (1, "interrupted", None)
    assert (second.number, second.status_code, second.error_class) == (2, 200, None)


async def test_a_claim_again_marks_only_the_lines_left_open_before_it(
    services: Services, db: Database
) -> None:
    """Claimed three times by processes that die, a delivery has lines 1 and 2 marked
    interrupted and line 3 (the attempt under way, logged in the same statement that marks
    the others) open: the mark must not reach the line its own claim writes."""
    clock = FakeClock()
    who, _ = await setup(services, clock, ["http://127.0.0.1:9/"])
    await raise_event(db, who, clock)
    for owner in ("dead-1", "dead-2", "alive"):
        now = clock.now()
        async with db.transaction() as conn:
            [claimed] = await delivery_queue.claim_deliveries(
                conn, owner=owner, now=now, lease_until=now + LEASE, limit=8, per_endpoint=8
            )
        clock.advance(LEASE.total_seconds() + 1)
    assert claimed.attempts == 3
    delivery, _ = await services.webhooks.get_delivery(who, claimed.id)
    lines = [(a.number, a.error_class, a.finished_at) for a in delivery.attempt_log]
    assert lines == [(1, "interrupted", None), (2, "interrupted", None), (3, None, None)]


async def test_a_delivery_claimed_again_goes_before_the_backlog(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    who, _ = await setup(services, clock, ["http://127.0.0.1:9/"])
    await raise_event(db, who, clock)
    now = clock.now()
    async with db.transaction() as conn:
        [dead] = await delivery_queue.claim_deliveries(
            conn, owner="dead", now=now, lease_until=now + LEASE, limit=8, per_endpoint=8
        )
    clock.advance(5)
    await raise_event(db, who, clock, n=5)  # a backlog that fell due during the lease
    clock.advance(LEASE.total_seconds())
    now = clock.now()
    async with db.transaction() as conn:
        [first] = await delivery_queue.claim_deliveries(
            conn, owner="d", now=now, lease_until=now + LEASE, limit=1, per_endpoint=8
        )
    assert (first.id, first.attempts) == (dead.id, 2)
