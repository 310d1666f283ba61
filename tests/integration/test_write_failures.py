"""A run whose progress cannot be written fails alone and is released at once (issue 19,
finding 1): the runs that shared its group write still finish, and it does not sit leased
until its lease ends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.clock import FakeClock
from flowhook.engine.worker import Worker
from flowhook.service import Services
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, RunStatus
from flowhook.store.tables import runs

FLOW = {"name": "w", "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}]}


async def test_a_run_whose_write_fails_is_released_at_once_and_its_batch_still_lands(
    services: Services, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    services.runs._clock = clock  # type: ignore[attr-defined]
    created = await services.keys.create(Mode.TEST, "ws")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    flow = await services.flows.create(who, FLOW)
    ids = [
        (await services.runs.start(who, flow_id=flow.flow_id, payload={})).run.run_id
        for _ in range(6)
    ]
    batches: list[list[str]] = []
    poisoned: list[str] = []  # the last run of the first batch that several runs share
    real = runs_store.apply_progress

    async def apply_progress(
        conn: AsyncConnection,
        items: Sequence[runs_store.Progress],
        *,
        owner: str,
        handoff: Any = None,
    ) -> list[bool]:
        batches.append([item.run_id for item in items])
        if len(batches) == 1 and len(items) < len(ids):  # let the others queue behind it
            async with asyncio.timeout(10):
                while len(items) + len(worker._writes._pending) < len(ids):
                    await asyncio.sleep(0.005)
        if not poisoned and len(items) > 1:
            poisoned.append(items[-1].run_id)
        if poisoned and any(item.run_id == poisoned[0] for item in items):
            raise RuntimeError("this run's progress cannot be stored")
        return await real(conn, items, owner=owner, handoff=handoff)

    monkeypatch.setattr(runs_store, "apply_progress", apply_progress)
    worker = Worker(db, clock, services.wakeup, lease_seconds=30)
    assert await worker.run_once() == 6
    await worker.drain()

    [bad] = poisoned  # it shared a group write with other runs
    async with db.read() as conn:
        rows = {
            r.run_id: r
            for r in await conn.execute(
                select(runs.c.run_id, runs.c.status, runs.c.lease_owner, runs.c.available_at)
            )
        }
    assert {r: rows[r].status for r in ids if r != bad} == {
        r: str(RunStatus.COMPLETED) for r in ids if r != bad
    }
    stuck = rows[bad]
    assert (stuck.status, stuck.lease_owner) == (str(RunStatus.QUEUED), None)
    assert stuck.available_at.replace(tzinfo=None) <= clock.now().replace(tzinfo=None)
