"""Retention gives the disk back (issues 18 and 20): 20,000 finished runs with their history
pushed in bulk, pruned while the API is asked for things, and on SQLite the files at most half
their size afterwards; delivered events' bodies cleared after their own window; the size
reported on /metrics and the overview page."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update

from bench import history
from flowhook.ids import id_floor
from flowhook.service import Services
from flowhook.store import space
from flowhook.store.db import Database
from flowhook.store.retention import CLEARED_BODY
from flowhook.store.tables import (
    deliveries,
    delivery_attempts,
    events,
    retention_marks,
    run_steps,
    runs,
)
from tests.conftest import Api, Receiver

FLOW: dict[str, Any] = {
    "name": "three",
    "steps": [
        {"id": "a", "type": "transform", "output": {"x": "{{ payload.n + 1 }}"}},
        {"id": "b", "type": "transform", "output": {"y": "{{ steps.a.output.x * 2 }}"}},
        {"id": "c", "type": "transform", "output": {"z": "{{ steps.b.output.y }}"}},
    ],
}


async def _one_delivered_run(api: Api, receiver: Receiver) -> str:
    """A run of the three-transform flow whose ``flow.completed`` was delivered."""
    r = await api.post(
        "/api/v1/webhooks/endpoints", {"url": receiver.url, "events": ["flow.completed"]}
    )
    assert r.status_code == 201, r.text
    run_id = await api.execute(await api.create_flow(FLOW), {"n": 1})
    assert (await api.wait(run_id))["status"] == "completed"
    async with asyncio.timeout(10):
        while True:
            r = await api.get(f"/api/v1/webhooks/deliveries?run_id={run_id}")
            assert r.status_code == 200, r.text
            if [d for d in r.json()["data"] if d["status"] == "succeeded"]:
                return run_id
            await asyncio.sleep(0.05)


def _files(url: str) -> int:
    path = Path(url.removeprefix("sqlite:///"))
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def _count(db: Database, table: Any) -> int:
    async with db.read() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table)) or 0)


@pytest.mark.soak  # 20,000 runs of history: a volume test (test_heavy_runs_… prunes in the gate)
async def test_pruning_20000_runs_gives_the_disk_back_while_the_api_answers(
    api: Api, receiver: Receiver
) -> None:
    services: Services = api.app.state.services
    db, url = services.db, services.settings.database_url
    template_id = await _one_delivered_run(api, receiver)
    template = await history.read_template(db, template_id)
    assert len(template.steps) == 3 and template.deliveries and template.attempts
    # 20,000 copies of it, finished 40 to 70 days ago (retention keeps 30)
    print(
        "grew in",
        await history.grow(
            db, url, template, 20_000, days=30, now=datetime.now(UTC) - timedelta(days=40)
        ),
    )
    assert await _count(db, runs) == 20_001
    if db.is_sqlite:
        async with db.read() as conn:
            assert (await space.storage(conn)).auto_vacuum == "incremental"
    grown = _files(url) if db.is_sqlite else 0

    # the API is asked for things all along: reads, and executes (writes) on SQLite's writer
    answers: list[int] = []
    failures: list[str] = []
    pruning = True

    async def ask() -> None:
        flow_id = await api.create_flow(FLOW)
        n = 0
        while pruning:
            n += 1
            for r in (
                await api.get(f"/api/v1/flows/runs/{template_id}"),
                await api.post("/api/v1/flows/execute", {"flow_id": flow_id, "payload": {"n": n}}),
            ):
                (answers if r.status_code in (200, 202) else failures).append(r.status_code)
            await asyncio.sleep(0.02)  # a client asking ~50 times a second, not a flood

    asking = asyncio.create_task(ask())
    try:
        done = await services.retention.prune_all()
    finally:
        pruning = False
        await asking
    assert failures == []
    assert len(answers) >= 20, "the API was not asked while pruning ran"
    assert done.runs == 20_000
    assert await _count(db, runs) >= 1  # the template and the executes are young
    ms = int((datetime.now(UTC) - timedelta(days=35)).timestamp() * 1000)
    async with db.read() as conn:  # none of the copies' events, deliveries or attempts is left
        for column, prefix in ((events.c.id, "evt"), (deliveries.c.id, "dlv")):
            assert await conn.scalar(select(func.count()).where(column < id_floor(prefix, ms))) == 0
        assert (
            await conn.scalar(
                select(func.count()).where(delivery_attempts.c.delivery_id < id_floor("dlv", ms))
            )
            == 0
        )
    if db.is_sqlite:
        assert done.pages_freed > 0
        after = _files(url)
        assert after <= grown / 2, f"the files went from {grown:,} to {after:,} bytes"
        async with db.read() as conn:
            assert (await space.storage(conn)).free_bytes == 0
    else:
        async with db.read() as conn:
            assert (await space.storage(conn)).size_bytes > 0


async def test_heavy_runs_copied_from_a_real_one_are_pruned_whole(
    api: Api, receiver: Receiver
) -> None:
    """bench/growth.py --step-copies: runs holding their steps many times over, as long
    flows write them; the pass removes every one of their rows and keeps the template's."""
    services: Services = api.app.state.services
    db, url = services.db, services.settings.database_url
    template_id = await _one_delivered_run(api, receiver)
    heavy = (await history.read_template(db, template_id)).with_steps_copied(40)
    assert len(heavy.steps) == 120 and heavy.rows_per_run == 128
    assert len({s["idx"] for s in heavy.steps}) == len({s["step_id"] for s in heavy.steps}) == 120
    await history.grow(db, url, heavy, 300, days=5, now=datetime.now(UTC) - timedelta(days=40))
    assert await _count(db, run_steps) == 3 + 300 * 120
    done = await services.retention.prune_all()
    assert done.runs == 300
    assert await _count(db, runs) == 1 and await _count(db, run_steps) == 3
    async with db.read() as conn:
        steps = (await conn.execute(select(run_steps.c.step_id).order_by(run_steps.c.idx))).all()
    assert [s for (s,) in steps] == ["a", "b", "c"]


async def test_delivered_bodies_go_after_their_window_and_failed_ones_stay(
    api: Api, receiver: Receiver
) -> None:
    services: Services = api.app.state.services
    db = services.db
    delivered = await _one_delivered_run(api, receiver)
    receiver.default = (500, {"no": True})
    flow_id = (await api.get("/api/v1/flows")).json()["data"][0]["flow_id"]
    failed_run = await api.execute(flow_id, {"n": 2})
    async with asyncio.timeout(20):
        while True:
            r = await api.get(f"/api/v1/webhooks/deliveries?run_id={failed_run}")
            found = r.json()["data"]
            if found and found[0]["status"] == "failed":
                failed_delivery = found[0]["id"]
                break
            await asyncio.sleep(0.1)
    # ten days ago, both (the runs are kept 30, delivered bodies 7)
    async with db.transaction() as conn:
        ago = datetime.now(UTC) - timedelta(days=10)
        run_ids = [delivered, failed_run]
        evt_ids = list(
            (await conn.execute(select(events.c.id).where(events.c.run_id.in_(run_ids)))).scalars()
        )
        renamed = {e: "evt_" + _ten_days_ago_id(e, ago) for e in evt_ids}
        for old, new in renamed.items():
            await conn.execute(update(events).where(events.c.id == old).values(id=new))
            await conn.execute(
                update(deliveries).where(deliveries.c.event_id == old).values(event_id=new)
            )
        # the app's retention pass at start moved the mark past ten days ago (no event made
        # now has an older id; these were backdated by hand): start from the beginning again
        await conn.execute(delete(retention_marks))
    done = await services.retention.prune_all()
    assert done.runs == 0 and done.events_cleared >= len(evt_ids)
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(events.c.run_id, events.c.type, events.c.body).where(
                    events.c.run_id.in_(run_ids)
                )
            )
        ).all()
        excerpts = (
            await conn.execute(
                select(deliveries.c.run_id, delivery_attempts.c.response_excerpt).join(
                    delivery_attempts, delivery_attempts.c.delivery_id == deliveries.c.id
                )
            )
        ).all()
    for run_id, type_, body in rows:
        if run_id == delivered:
            assert body == CLEARED_BODY, type_
        elif type_ == "flow.completed":  # its delivery failed: kept for a replay
            assert body != CLEARED_BODY
    assert [e for r, e in excerpts if r == delivered] == [None]
    assert all(e is not None for r, e in excerpts if r == failed_run)
    # the delivered one cannot be sent again; the failed one can
    r = await api.get(f"/api/v1/webhooks/deliveries?run_id={delivered}")
    gone = r.json()["data"][0]["id"]
    r = await api.post(f"/api/v1/webhooks/deliveries/{gone}/replay")
    assert r.status_code == 409, r.text
    assert "FLOWHOOK_DELIVERY_RETENTION_DAYS" in r.json()["error"]
    r = await api.post(f"/api/v1/webhooks/deliveries/{failed_delivery}/replay")
    assert r.status_code in (200, 201, 202), r.text
    # a second pass starts where the first stopped and finds nothing more to clear
    assert (await services.retention.prune_all()).events_cleared == 0


def _ten_days_ago_id(event_id: str, at: datetime) -> str:
    """``event_id`` with the time part of an id made at ``at`` (the rest kept, so unique)."""
    head = history._head(int(at.timestamp() * 1000))
    return head + event_id.partition("_")[2][10:]


async def test_metrics_and_overview_report_the_database_size(api: Api) -> None:
    r = await api.client.get("/metrics")
    assert r.status_code == 200
    size = [ln for ln in r.text.splitlines() if ln.startswith("flowhook_database_size_bytes ")]
    assert size and float(size[0].split()[1]) > 0
    services: Services = api.app.state.services
    if services.db.is_sqlite:
        free = [ln for ln in r.text.splitlines() if ln.startswith("flowhook_database_free_bytes ")]
        assert free and float(free[0].split()[1]) >= 0


async def test_vacuum_converts_an_older_sqlite_database_once(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:  # as versions before incremental auto-vacuum made it
        old.execute("CREATE TABLE t (x BLOB)")
        old.executemany("INSERT INTO t VALUES (randomblob(4000))", [()] * 500)
        old.execute("DELETE FROM t")
    db = Database(f"sqlite:///{path}")
    try:
        async with db.read() as conn:
            before = await space.storage(conn)
        assert before.auto_vacuum == "none" and before.free_bytes
        assert await space.free_pages(db, 1000) == space.Freed(0)  # nothing to give back yet
        converted, _ = await space.convert_to_incremental(db)
        async with db.read() as conn:
            after = await space.storage(conn)
        assert converted and after.auto_vacuum == "incremental"
        assert after.size_bytes < before.size_bytes / 10
        assert (await space.convert_to_incremental(db))[0] is False  # once only
    finally:
        await db.dispose()


async def test_a_vacuum_step_counts_the_writer_held_not_its_wait_for_it(tmp_path: Path) -> None:
    """Retention sizes its vacuum steps by what one held: another process holding the write
    lock for 0.3 s delays the step, and the step still reports only its own few ms."""
    import sqlite3
    import threading
    import time

    path = tmp_path / "free.db"
    db = Database(f"sqlite:///{path}")
    try:
        async with db.read() as conn:
            assert (await space.storage(conn)).auto_vacuum == "incremental"
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("CREATE TABLE t (x BLOB)")
        other.executemany("INSERT INTO t VALUES (randomblob(4000))", [()] * 500)
        other.execute("DELETE FROM t")
        async with db.read() as conn:
            before = await space.storage(conn)
        free = (before.free_bytes or 0) // (before.page_size or 1)
        assert free * (before.page_size or 1) >= 500 * 4000
        began = time.perf_counter()  # before the timer starts: it never fires early
        other.execute("BEGIN IMMEDIATE")  # another process's writer, for 0.3 s
        threading.Timer(0.3, lambda: other.execute("COMMIT")).start()
        freed = await space.free_pages(db, 100)
        waited = time.perf_counter() - began
        other.close()
        assert waited >= 0.3 and freed.held < 0.15, (waited, freed)
        assert freed.left == free - 100  # a hundred free pages went
    finally:
        await db.dispose()


async def test_the_prune_command_removes_what_retention_allows(
    api: Api, receiver: Receiver
) -> None:
    """`flowhook prune --days 30`, as an operator runs it: the runs finished before then go
    with their history, the young ones stay, and it says how many went."""
    import os
    import sys

    services: Services = api.app.state.services
    db, settings = services.db, services.settings
    template = await history.read_template(db, await _one_delivered_run(api, receiver))
    await history.grow(db, settings.database_url, template, 300, days=5,
                       now=datetime.now(UTC) - timedelta(days=40))  # fmt: skip
    assert await _count(db, runs) == 301
    env = {**os.environ, "FLOWHOOK_DATABASE_URL": settings.database_url}
    if settings.secret_key is not None:
        env["FLOWHOOK_SECRET_KEY"] = settings.secret_key.get_secret_value()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flowhook", "prune", "--days", "30", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:  # timed out: leave no process behind
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert "removed 300 finished runs" in out.decode(), out.decode()
    assert await _count(db, runs) == 1  # the template, finished just now
