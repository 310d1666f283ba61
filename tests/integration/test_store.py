"""The store on both backends: schema, queue claims, leases, guarded transitions."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import update

from flowhook.clock import FakeClock
from flowhook.engine.executor import Executor
from flowhook.events import make_event
from flowhook.ids import new_id, unpack_id
from flowhook.service import Services
from flowhook.store import events as events_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.migrate import current_revision, head_revision, migrate
from flowhook.store.models import Mode, Run, RunStatus, RunStep, StepStatus
from flowhook.store.tables import metadata, runs
from tests.support import TEST_SECRET_KEY

FLOW: dict[str, Any] = {
    "name": "s",
    "steps": [{"id": "a", "type": "transform", "output": {"x": "{{ payload.x }}"}}],
}


async def test_migrated_schema_matches_the_declared_one(db: Database) -> None:
    def diff(sync_conn: Any) -> list[Any]:
        return list(compare_metadata(MigrationContext.configure(sync_conn), metadata))

    async with db.writer.connect() as conn:
        assert await conn.run_sync(diff) == []
    assert await current_revision(db) == head_revision()
    await migrate(db)  # idempotent
    assert await current_revision(db) == head_revision()


async def _queued(services: Services, n: int, clock: FakeClock) -> tuple[list[str], Any]:
    created = await services.keys.create(Mode.TEST, "ws")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    flow = await services.flows.create(who, FLOW)
    services.runs._clock = clock
    ids = []
    for i in range(n):
        started = await services.runs.start(who, flow_id=flow.flow_id, payload={"x": i})
        ids.append(started.run.run_id)
    return ids, who


async def test_a_cancel_answers_with_the_run_as_it_is_after_its_flag(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker claims and starts the run between the cancel's first read and its flag: the
    answer is the run as it is then (running, flagged for its worker), not as first read."""
    clock = FakeClock()
    [run_id], who = await _queued(services, 1, clock)
    cancel_unleased = runs_store.cancel_unleased

    async def a_worker_moves_first(conn: Any, *args: Any, **kw: Any) -> bool:
        moved = {"status": "running", "lease_owner": "w-1", "lease_expires_at": clock.now()}
        await conn.execute(update(runs).where(runs.c.run_id == run_id).values(**moved))
        return await cancel_unleased(conn, *args, **kw)

    monkeypatch.setattr(runs_store, "cancel_unleased", a_worker_moves_first)
    run = await services.runs.cancel(who, run_id)
    assert run.status is RunStatus.RUNNING
    assert run.cancel_requested_at is not None


async def test_concurrent_claims_never_share_a_run(services: Services, db: Database) -> None:
    clock = FakeClock()
    ids, _ = await _queued(services, 30, clock)
    now = clock.now()

    async def claim(owner: str) -> list[str]:
        got: list[str] = []
        for _ in range(10):
            async with db.transaction() as conn:
                runs = await runs_store.claim_runs(
                    conn, owner=owner, now=now, lease_until=now + timedelta(seconds=30), limit=2
                )
            got += [r.run_id for r in runs]
        return got

    results = await asyncio.gather(*(claim(f"w{i}") for i in range(4)))
    claimed = [run_id for r in results for run_id in r]
    assert sorted(claimed) == sorted(ids)
    assert len(set(claimed)) == len(claimed)


async def test_a_claimed_run_is_the_run_as_read_back(services: Services, db: Database) -> None:
    """The claim reads its runs on the driver on PostgreSQL (``bulk.run_pg``): each field is
    what SQLAlchemy reads of the same row, with every column of a run set."""
    clock = FakeClock()
    [run_id], _ = await _queued(services, 1, clock)
    values = {
        "priority": 3, "concurrency_key": "k", "concurrency_slot": "k#1", "throttle_key": "t",
        "throttle_at": clock.now(), "debounce_key": "d", "parent_idx": 2,
        "scope": {"item": [1, "é"], "none": None}, "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "output": {"o": 1.5}, "error": {"type": "x"}, "cancel_requested_at": clock.now(),
        "rerun_of": new_id("run"), "parent_run_id": new_id("run"), "root_run_id": new_id("run"),
    }  # fmt: skip
    async with db.transaction() as conn:
        await conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values))
    now = clock.now()
    async with db.transaction() as conn:
        [claimed] = await runs_store.claim_runs(
            conn, owner="a", now=now, lease_until=now + timedelta(seconds=30), limit=5
        )
    async with db.read() as conn:
        read = await runs_store.get_run_by_id(conn, run_id)
    assert read is not None
    read.steps = []
    assert claimed == read
    assert claimed.mode is Mode.TEST and claimed.status is RunStatus.QUEUED
    assert claimed.scope == values["scope"] and claimed.payload == {"x": 0}


async def test_an_expired_lease_makes_the_run_claimable_again(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    [run_id], _ = await _queued(services, 1, clock)
    now = clock.now()
    lease = timedelta(seconds=30)
    async with db.transaction() as conn:
        first = await runs_store.claim_runs(
            conn, owner="a", now=now, lease_until=now + lease, limit=5
        )
    assert [r.run_id for r in first] == [run_id]
    async with db.transaction() as conn:
        assert (
            await runs_store.claim_runs(
                conn, owner="b", now=now + timedelta(seconds=29), lease_until=now + lease, limit=5
            )
            == []
        )
    later = now + timedelta(seconds=31)
    async with db.transaction() as conn:
        second = await runs_store.claim_runs(
            conn, owner="b", now=later, lease_until=later + lease, limit=5
        )
    assert [r.run_id for r in second] == [run_id]
    assert second[0].claims == 2
    # The first owner lost its lease: its writes are refused and roll back.
    with pytest.raises(runs_store.LeaseLost):
        await _move(db, run_id, owner="a", status=RunStatus.RUNNING)
    # Heartbeats extend only the leases the owner holds.
    async with db.transaction() as conn:
        assert (
            await runs_store.extend_leases(conn, owner="a", run_ids=[run_id], until=later + lease)
            == 0
        )
        assert (
            await runs_store.extend_leases(
                conn, owner="b", run_ids=[run_id], until=later + 2 * lease
            )
            == 1
        )


async def _move(db: Database, run_id: str, *, owner: str, status: RunStatus) -> None:
    """Move a run as the executor does; a refused move raises LeaseLost."""
    progress = runs_store.Progress(run_id, (runs_store.StatusChange(status, {}),))
    async with db.transaction() as conn:
        [ok] = await runs_store.apply_progress(conn, [progress], owner=owner)
    if not ok:
        raise runs_store.LeaseLost(run_id)


async def test_a_crashed_worker_s_run_is_finished_by_the_next(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    [run_id], who = await _queued(services, 1, clock)
    now = clock.now()
    async with db.transaction() as conn:
        await runs_store.claim_runs(
            conn, owner="dead", now=now, lease_until=now + timedelta(seconds=30), limit=1
        )
    clock.advance(31)
    later = clock.now()
    async with db.transaction() as conn:
        [claimed] = await runs_store.claim_runs(
            conn, owner="alive", now=later, lease_until=later + timedelta(seconds=30), limit=1
        )
    assert await Executor(db, clock, "alive").execute(claimed) is RunStatus.COMPLETED
    run = await services.runs.get(who, run_id)
    assert run.status is RunStatus.COMPLETED
    assert [s.step_id for s in run.steps] == ["a"]


async def test_terminal_runs_cannot_move(services: Services, db: Database) -> None:
    clock = FakeClock()
    [run_id], _ = await _queued(services, 1, clock)
    now = clock.now()
    async with db.transaction() as conn:
        [claimed] = await runs_store.claim_runs(
            conn, owner="w", now=now, lease_until=now + timedelta(seconds=30), limit=1
        )
    await Executor(db, clock, "w").execute(claimed)
    for target in (RunStatus.RUNNING, RunStatus.FAILED, RunStatus.COMPLETED):
        with pytest.raises(runs_store.LeaseLost):
            await _move(db, run_id, owner="w", status=target)


async def test_cancel_requested_while_running_ends_the_run_cancelled(
    services: Services, db: Database
) -> None:
    clock = FakeClock()
    [run_id], who = await _queued(services, 1, clock)
    now = clock.now()
    async with db.transaction() as conn:
        [claimed] = await runs_store.claim_runs(
            conn, owner="w", now=now, lease_until=now + timedelta(seconds=30), limit=1
        )
    cancelled = await services.runs.cancel(who, run_id)  # held by a worker: flagged
    assert cancelled.status is RunStatus.QUEUED and cancelled.cancel_requested_at is not None
    assert await Executor(db, clock, "w").execute(claimed) is RunStatus.CANCELLED
    run = await services.runs.get(who, run_id)
    assert run.status is RunStatus.CANCELLED
    events = await services.runs.events(who, run_id)
    assert [e.type for e in events] == ["flow.cancelled"]


async def test_idempotency_keys_are_unique_per_workspace_and_mode(db: Database) -> None:
    from sqlalchemy.exc import IntegrityError

    clock = FakeClock()

    def run() -> Run:
        return Run(
            new_id("run"), "ws_a", Mode.TEST, "wf_x", 1, "api", RunStatus.QUEUED, {}, clock.now()
        )

    async with db.transaction() as conn:
        await runs_store.insert_run(conn, run(), idempotency_key="k", request_hash="h")
    with pytest.raises(IntegrityError):
        async with db.transaction() as conn:
            await runs_store.insert_run(conn, run(), idempotency_key="k", request_hash="h")


async def test_a_group_commit_applies_each_run_or_nothing_of_it(
    services: Services, db: Database
) -> None:
    """apply_progress batches every run's writes into a few statements; a run whose guard
    fails (lease lost, cancel requested) writes nothing, and the others still go through.
    The steps go with their run's move (on PostgreSQL in its statement), a step written
    twice in one batch as it was last, and runs moved in two shapes each get theirs."""
    clock = FakeClock()
    ids, who = await _queued(services, 4, clock)
    now = clock.now()
    async with db.transaction() as conn:
        await runs_store.claim_runs(
            conn, owner="me", now=now, lease_until=now + timedelta(seconds=30), limit=4
        )
    mine, stolen, cancelled, started = ids
    async with db.transaction() as conn:
        await conn.execute(
            update(runs).where(runs.c.run_id == stolen).values(lease_owner="someone-else")
        )
        assert (
            await runs_store.request_cancel(conn, who.workspace_id, who.mode, cancelled, now)
            is True
        )

    def finished(run_id: str) -> runs_store.Progress:
        event = make_event(
            "flow.completed",
            workspace_id=who.workspace_id,
            mode=who.mode,
            flow_id="wf_x",
            run_id=run_id,
            payload={"status": "completed"},
            now=now,
        )
        return runs_store.Progress(
            run_id,
            (
                runs_store.StatusChange(RunStatus.RUNNING, {"started_at": now}),
                runs_store.StatusChange(
                    RunStatus.COMPLETED, {"finished_at": now, "output": {"n": 1}}
                ),
            ),
            [RunStep(0, "a", "transform", StepStatus.COMPLETED, 1, now, now, 0, {"x": 1})],
            [event],
        )

    running = RunStep(0, "a", "transform", StepStatus.RUNNING, 1, now, None, None, None)
    twice = finished(mine)
    twice = replace(twice, steps=[running, *twice.steps])  # the step's start, then its end
    begun = runs_store.Progress(
        started, (runs_store.StatusChange(RunStatus.RUNNING, {"started_at": now}),), [running]
    )
    async with db.transaction() as conn:
        results = await runs_store.apply_progress(
            conn, [twice, finished(stolen), finished(cancelled), begun], owner="me"
        )
    assert results == [True, False, False, True]
    async with db.read() as conn:
        done = await runs_store.get_run_by_id(conn, mine)
        left = [await runs_store.get_run_by_id(conn, r) for r in (stolen, cancelled)]
        raised = {e.run_id for e in await events_store.list_events_for_run(conn, mine)}
        others = [await events_store.list_events_for_run(conn, r) for r in (stolen, cancelled)]
    assert done is not None and done.status is RunStatus.COMPLETED and done.output == {"n": 1}
    assert [(s.step_id, s.status, s.output) for s in done.steps] == [
        ("a", StepStatus.COMPLETED, {"x": 1})
    ]
    assert raised == {mine}
    async with db.read() as conn:
        begun_run = await runs_store.get_run_by_id(conn, started)
    assert begun_run is not None and begun_run.status is RunStatus.RUNNING
    assert [(s.step_id, s.status) for s in begun_run.steps] == [("a", StepStatus.RUNNING)]
    for run in left:
        assert run is not None and run.status is RunStatus.QUEUED and run.steps == []
    assert others == [[], []]


async def test_migration_0008_gives_claimable_rows_their_due_time(tmp_path: Any) -> None:
    """Upgrading a database that holds runs: a queued run keeps its place in the queue (its
    ``due_at`` is when it fell due), a finished one is left alone."""
    import sqlite3

    path = tmp_path / "old.db"
    old = Database(f"sqlite:///{path}", secret_key=TEST_SECRET_KEY)
    await migrate(old, "0007")
    await old.dispose()
    raw = sqlite3.connect(path)
    raw.execute("INSERT INTO workspaces (id, name, created_at) VALUES ('ws', 'ws', '2026-01-01')")
    for run_id, status, available in (
        ("run_a", "queued", "2026-01-02 00:00:00.000000"),
        ("run_b", "completed", "2026-01-03 00:00:00.000000"),
    ):
        raw.execute(
            "INSERT INTO runs (run_id, workspace_id, mode, flow_id, flow_version, trigger, status,"
            " payload, queued_at, available_at, claims, steps_executed, next_step)"
            " VALUES (?, 'ws', 'test', 'wf_x', 1, 'api', ?, '{}', '2026-01-01', ?, 0, 0, 0)",
            (run_id, status, available),
        )
    raw.commit()
    raw.close()
    new = Database(f"sqlite:///{path}", secret_key=TEST_SECRET_KEY)
    await migrate(new)
    await new.dispose()
    raw = sqlite3.connect(path)
    # The ids packed by 0023 (these, no ids of new_id, as byte 0 then their text).
    due = {unpack_id(k): v for k, v in raw.execute("SELECT run_id, due_at FROM runs")}
    raw.close()
    # Integer microseconds since the epoch from 0021 on (2026-01-02, and 1970-01-01 itself).
    assert due == {"run_a": 1767312000000000, "run_b": 0}
