"""The state machines, enforced by the database: every legal and illegal move of a run and
of a delivery, on both backends, through the writes the engine and the dispatcher use.

A move the transition table allows is applied (with its steps and events); any other is
refused by the guarded statement itself and reported (``False`` from ``apply_progress``, the
delivery's id from ``finish_attempts``), leaving the row, its steps and events untouched.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select, update

from flowhook.events import make_event
from flowhook.ids import new_id
from flowhook.signing import new_secret
from flowhook.store import attempts, delivery_reads, endpoints
from flowhook.store import deliveries as deliveries_store
from flowhook.store import events as events_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import (
    DELIVERY_TRANSITIONS,
    TRANSITIONS,
    Attempt,
    Delivery,
    DeliveryStatus,
    Endpoint,
    Mode,
    Run,
    RunStatus,
    RunStep,
    StepStatus,
)
from flowhook.store.tables import deliveries, delivery_attempts, runs

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = "w-1"

RUN_MOVES = [(a, b) for a in RunStatus for b in RunStatus]
DELIVERY_MOVES = [(a, b) for a in DeliveryStatus for b in DeliveryStatus]


async def _run_in(db: Database, status: RunStatus, *, owner: str = OWNER) -> str:
    run_id = new_id("run")
    run = Run(run_id, "ws_a", Mode.TEST, "wf_x", 1, "api", RunStatus.QUEUED, {}, NOW)
    async with db.transaction() as conn:
        await runs_store.insert_run(conn, run)
        await conn.execute(
            update(runs)
            .where(runs.c.run_id == run_id)
            .values(status=str(status), lease_owner=owner, lease_expires_at=NOW)
        )
    return run_id


def _progress(run_id: str, *changes: runs_store.StatusChange) -> runs_store.Progress:
    step = RunStep(
        idx=0,
        step_id="a",
        type="transform",
        status=StepStatus.COMPLETED,
        attempts=1,
        started_at=NOW,
        finished_at=NOW,
        duration_ms=0,
        output={"x": 1},
    )
    event = make_event(
        "flow.step_completed",
        workspace_id="ws_a",
        mode=Mode.TEST,
        flow_id="wf_x",
        run_id=run_id,
        payload={},
        now=NOW,
    )
    return runs_store.Progress(run_id, changes, [step], [event])


async def _apply(db: Database, progress: runs_store.Progress, owner: str = OWNER) -> bool:
    async with db.transaction() as conn:
        [ok] = await runs_store.apply_progress(conn, [progress], owner=owner)
    return ok


async def _state(db: Database, run_id: str) -> tuple[RunStatus, int, int]:
    """The run's status, and how many steps and events it has."""
    async with db.read() as conn:
        run = await runs_store.get_run_by_id(conn, run_id)
        raised = await events_store.list_events_for_run(conn, run_id)
    assert run is not None
    return run.status, len(run.steps), len(raised)


@pytest.mark.parametrize(("source", "target"), RUN_MOVES, ids=[f"{a}->{b}" for a, b in RUN_MOVES])
async def test_every_run_move(db: Database, source: RunStatus, target: RunStatus) -> None:
    run_id = await _run_in(db, source)
    legal = target in TRANSITIONS[source]
    change = runs_store.StatusChange(target, {"next_step": 1})
    assert await _apply(db, _progress(run_id, change)) is legal
    assert await _state(db, run_id) == ((target, 1, 1) if legal else (source, 0, 0))


@pytest.mark.parametrize("source", list(RunStatus))
async def test_a_run_that_starts_and_ends_in_one_write(db: Database, source: RunStatus) -> None:
    run_id = await _run_in(db, source)
    start = runs_store.StatusChange(RunStatus.RUNNING, {"started_at": NOW})
    end = runs_store.StatusChange(RunStatus.COMPLETED, {"finished_at": NOW})
    legal = source in (RunStatus.QUEUED, RunStatus.RUNNING)
    assert await _apply(db, _progress(run_id, start, end)) is legal
    assert (await _state(db, run_id))[0] is (RunStatus.COMPLETED if legal else source)
    if legal:  # an ended run gives up its lease in the same statement
        async with db.read() as conn:
            owner = (
                await conn.execute(select(runs.c.lease_owner).where(runs.c.run_id == run_id))
            ).scalar_one()
        assert owner is None


async def test_a_run_another_process_holds_cannot_be_moved(db: Database) -> None:
    run_id = await _run_in(db, RunStatus.RUNNING, owner="w-2")
    change = runs_store.StatusChange(RunStatus.COMPLETED, {})
    assert await _apply(db, _progress(run_id, change)) is False
    assert await _state(db, run_id) == (RunStatus.RUNNING, 0, 0)


async def test_a_cancel_flag_says_whether_a_worker_holds_the_run(db: Database) -> None:
    """``True``: a worker holds it and will end it; ``False``: no worker does (it was
    handed back), so the caller must; ``None``: nothing flagged (flagged already, ended)."""
    held = await _run_in(db, RunStatus.RUNNING)
    handed_back = await _run_in(db, RunStatus.RUNNING)
    ended = await _run_in(db, RunStatus.COMPLETED)
    async with db.transaction() as conn:
        await conn.execute(
            update(runs).where(runs.c.run_id == handed_back).values(lease_owner=None)
        )
    async with db.transaction() as conn:
        flag = runs_store.request_cancel
        assert await flag(conn, "ws_b", Mode.TEST, handed_back, NOW) is None  # not theirs
        assert await flag(conn, "ws_a", Mode.TEST, held, NOW) is True
        assert await flag(conn, "ws_a", Mode.TEST, handed_back, NOW) is False
        assert await flag(conn, "ws_a", Mode.TEST, held, NOW) is None
        assert await flag(conn, "ws_a", Mode.TEST, ended, NOW) is None


async def test_a_cancel_request_blocks_every_move_but_the_cancel(db: Database) -> None:
    run_id = await _run_in(db, RunStatus.RUNNING)
    async with db.transaction() as conn:
        assert await runs_store.request_cancel(conn, "ws_a", Mode.TEST, run_id, NOW) is True
    for target in (RunStatus.RUNNING, RunStatus.COMPLETED, RunStatus.FAILED):
        assert await _apply(db, _progress(run_id, runs_store.StatusChange(target, {}))) is False
    cancel = runs_store.StatusChange(RunStatus.CANCELLED, {}, honour_cancel=False)
    assert await _apply(db, _progress(run_id, cancel)) is True
    assert (await _state(db, run_id))[0] is RunStatus.CANCELLED


async def test_a_group_write_applies_the_legal_moves_and_reports_the_others(
    db: Database,
) -> None:
    """One batch mixing shapes: each run is judged by its own guard, in SQL."""
    moving = await _run_in(db, RunStatus.RUNNING)
    ended = await _run_in(db, RunStatus.COMPLETED)
    starting = await _run_in(db, RunStatus.QUEUED)
    stolen = await _run_in(db, RunStatus.RUNNING, owner="w-2")
    progress = [runs_store.StatusChange(RunStatus.RUNNING, {"next_step": 1})]
    finish = [runs_store.StatusChange(RunStatus.FAILED, {"finished_at": NOW})]
    batch = [
        _progress(moving, *progress),
        _progress(ended, *progress),
        _progress(starting, *progress, *finish),
        _progress(stolen, *finish),
    ]
    async with db.transaction() as conn:
        results = await runs_store.apply_progress(conn, batch, owner=OWNER)
    assert results == [True, False, True, False]
    assert await _state(db, moving) == (RunStatus.RUNNING, 1, 1)
    assert await _state(db, ended) == (RunStatus.COMPLETED, 0, 0)
    assert await _state(db, starting) == (RunStatus.FAILED, 1, 1)
    assert await _state(db, stolen) == (RunStatus.RUNNING, 0, 0)


async def test_cancelling_an_unleased_run_follows_the_table(db: Database) -> None:
    for source in RunStatus:
        run_id = await _run_in(db, source)
        async with db.transaction() as conn:
            await conn.execute(update(runs).where(runs.c.run_id == run_id).values(lease_owner=None))
            done = await runs_store.cancel_unleased(
                conn, "ws_a", Mode.TEST, run_id, NOW, duration_ms=None, steps_executed=0
            )
        assert done is (RunStatus.CANCELLED in TRANSITIONS[source]), source


async def test_an_unleased_cancel_is_refused_when_the_run_moved_on_since_it_was_read(
    db: Database,
) -> None:
    run_id = await _run_in(db, RunStatus.RUNNING)
    async with db.transaction() as conn:
        await conn.execute(
            update(runs).where(runs.c.run_id == run_id).values(lease_owner=None, steps_executed=2)
        )
        stale = await runs_store.cancel_unleased(
            conn, "ws_a", Mode.TEST, run_id, NOW, duration_ms=5, steps_executed=1
        )
        fresh = await runs_store.cancel_unleased(
            conn, "ws_a", Mode.TEST, run_id, NOW, duration_ms=5, steps_executed=2
        )
    assert (stale, fresh) == (False, True)


async def _delivery_in(db: Database, status: DeliveryStatus, *, owner: str = OWNER) -> str:
    event = make_event(
        "flow.completed",
        workspace_id="ws_a",
        mode=Mode.TEST,
        flow_id="wf_x",
        run_id=None,
        payload={},
        now=NOW,
    )
    delivery = Delivery.queued(new_id("dlv"), event, "ep_gone")
    async with db.transaction() as conn:
        await events_store.insert_events(conn, [event])
        await deliveries_store.insert_deliveries(conn, [delivery])
        await conn.execute(
            update(deliveries)
            .where(deliveries.c.id == delivery.id)
            .values(status=str(status), lease_owner=owner, attempts=1)
        )
        await conn.execute(
            delivery_attempts.insert().values(delivery_id=delivery.id, number=1, started_at=NOW)
        )
    return delivery.id


def _completion(delivery_id: str, target: DeliveryStatus) -> attempts.Completion:
    later = NOW + timedelta(seconds=1)
    attempt = Attempt(number=1, started_at=NOW, finished_at=later, duration_ms=1000)
    return attempts.Completion(
        delivery_id=delivery_id,
        endpoint_id="ep_gone",
        attempt=attempt,
        status=target,
        next_attempt_at=later + timedelta(seconds=5) if target is DeliveryStatus.PENDING else None,
        last_error=None,
    )


async def _delivery_status(db: Database, delivery_id: str) -> DeliveryStatus:
    async with db.read() as conn:
        value = (
            await conn.execute(select(deliveries.c.status).where(deliveries.c.id == delivery_id))
        ).scalar_one()
    return DeliveryStatus(value)


@pytest.mark.parametrize(
    ("source", "target"), DELIVERY_MOVES, ids=[f"{a}->{b}" for a, b in DELIVERY_MOVES]
)
async def test_every_delivery_move(
    db: Database, source: DeliveryStatus, target: DeliveryStatus
) -> None:
    delivery_id = await _delivery_in(db, source)
    async with db.transaction() as conn:
        lost = await attempts.finish_attempts(conn, [_completion(delivery_id, target)], owner=OWNER)
    legal = target in DELIVERY_TRANSITIONS[source]
    assert lost == ([] if legal else [delivery_id])
    assert await _delivery_status(db, delivery_id) is (target if legal else source)


async def test_a_delivery_another_process_claimed_is_left_alone_and_reported(
    db: Database,
) -> None:
    mine = await _delivery_in(db, DeliveryStatus.PENDING)
    theirs = await _delivery_in(db, DeliveryStatus.PENDING, owner="w-2")
    async with db.transaction() as conn:
        lost = await attempts.finish_attempts(
            conn,
            [
                _completion(theirs, DeliveryStatus.SUCCEEDED),
                _completion(mine, DeliveryStatus.FAILED),
            ],
            owner=OWNER,
        )
    assert lost == [theirs]
    assert await _delivery_status(db, mine) is DeliveryStatus.FAILED
    assert await _delivery_status(db, theirs) is DeliveryStatus.PENDING
    async with db.read() as conn:  # the attempt's line still records what it saw
        found = await delivery_reads.get_delivery(conn, "ws_a", Mode.TEST, theirs)
    assert found is not None and found.attempt_log[0].duration_ms == 1000


async def test_successes_move_log_and_heal_in_one_statement_on_postgresql(db: Database) -> None:
    """The usual group (successes, no FIFO endpoint): the deliveries move, every attempt's
    line is written (a lost delivery's too) and the endpoints' failure windows end; on
    PostgreSQL in one statement, on SQLite in three."""
    ep = Endpoint(
        "ep_gone", "ws_a", Mode.TEST, "https://x.example/h", "", True, ["flow.completed"],
        new_secret(), NOW, NOW, failing_since=NOW,
    )  # fmt: skip
    async with db.transaction() as conn:
        await endpoints.insert_endpoint(conn, ep)
    mine = await _delivery_in(db, DeliveryStatus.PENDING)
    theirs = await _delivery_in(db, DeliveryStatus.PENDING, owner="w-2")
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(db.writer.sync_engine, "before_cursor_execute", record)
    try:
        async with db.transaction() as conn:
            lost = await attempts.finish_attempts(
                conn,
                [
                    _completion(theirs, DeliveryStatus.SUCCEEDED),
                    _completion(mine, DeliveryStatus.SUCCEEDED),
                ],
                owner=OWNER,
                healthy=["ep_gone"],
            )
    finally:
        event.remove(db.writer.sync_engine, "before_cursor_execute", record)
    assert lost == [theirs]
    assert await _delivery_status(db, mine) is DeliveryStatus.SUCCEEDED
    assert await _delivery_status(db, theirs) is DeliveryStatus.PENDING
    async with db.read() as conn:
        for delivery_id in (mine, theirs):
            found = await delivery_reads.get_delivery(conn, "ws_a", Mode.TEST, delivery_id)
            assert found is not None and found.attempt_log[0].duration_ms == 1000
        healed = await endpoints.get_endpoint(conn, "ep_gone")
    assert healed is not None and healed.failing_since is None
    if not db.is_sqlite:
        assert len(seen) == 1, seen


async def test_the_guard_holds_on_sqlalchemy_s_path_too(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the inline driver's raw connection (SQLite) the guarded write goes through
    SQLAlchemy row by row (PostgreSQL keeps its own statement); the verdicts are the same."""
    from flowhook.store import sqlite_driver

    monkeypatch.setattr(sqlite_driver, "raw_sqlite", lambda _conn: None)
    moving = await _run_in(db, RunStatus.RUNNING)
    ended = await _run_in(db, RunStatus.FAILED)
    change = runs_store.StatusChange(RunStatus.COMPLETED, {"finished_at": NOW})
    async with db.transaction() as conn:
        results = await runs_store.apply_progress(
            conn, [_progress(moving, change), _progress(ended, change)], owner=OWNER
        )
    assert results == [True, False]
    assert await _state(db, moving) == (RunStatus.COMPLETED, 1, 1)
    assert await _state(db, ended) == (RunStatus.FAILED, 0, 0)
