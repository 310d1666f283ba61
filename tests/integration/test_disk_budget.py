"""The disk budget (issue 54): past ``FLOWHOOK_DISK_BUDGET_MB`` retention deletes the oldest
finished runs ahead of their age, never a run still going, gives the space back and says so;
without a budget nothing goes before its age. The use against the budget is on the health
answer, /metrics and the overview page."""

from __future__ import annotations

import logging
import os
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from bench import history
from flowhook.clock import SystemClock
from flowhook.service import Services
from flowhook.service.retention import RetentionService
from flowhook.store import space
from flowhook.store.db import Database
from flowhook.store.tables import events, run_steps, runs
from tests.conftest import Api, open_api

FLOW: dict[str, Any] = {
    "name": "big",
    "steps": [{"id": "a", "type": "transform", "output": {"x": "{{ payload.n }}"}}],
}

COPIES = 400
STILL_GOING = 5


async def _usage(db: Database) -> space.Usage:
    async with db.read() as conn:
        return await space.usage(conn)


async def _finished_ids(db: Database) -> list[str]:
    """The finished runs, oldest finished first."""
    async with db.read() as conn:
        found = await conn.execute(
            select(runs.c.run_id)
            .where(runs.c.finished_at.is_not(None))
            .order_by(runs.c.finished_at, runs.c.run_id)
        )
        return [r for (r,) in found]


async def _fill(api: Api) -> tuple[str, list[str]]:
    """A real finished run, then :data:`COPIES` copies of it finished over the last 5 days
    (young: retention's 30 days keep them all), each with three steps of 20 KB of random
    output; the :data:`STILL_GOING` oldest copies made runs still going (queued, due in ten
    days, so no worker takes them). The template's id and those of the runs still going."""
    services: Services = api.app.state.services
    db = services.db
    template_id = await api.execute(await api.create_flow(FLOW), {"n": 1})
    assert (await api.wait(template_id))["status"] == "completed"
    template = await history.read_template(db, template_id)
    blob = os.urandom(10_000).hex()  # does not compress: it takes its size on either backend
    steps = [{**template.steps[0], "idx": i, "step_id": f"s{i}", "output": {"blob": blob}}
             for i in range(3)]  # fmt: skip
    template.steps = steps
    now = datetime.now(UTC)
    await history.grow(db, services.settings.database_url, template, COPIES, days=5, now=now)
    oldest = (await _finished_ids(db))[:STILL_GOING]
    later = now + timedelta(days=10)
    async with db.transaction() as conn:
        await conn.execute(
            update(runs)
            .where(runs.c.run_id.in_(oldest))
            .values(status="queued", finished_at=None, available_at=later, due_at=later)
        )
    if not db.is_sqlite:  # the statistics the estimate of free space reads, as autovacuum
        await space.vacuum_tables(db, ["runs"])
    return template_id, oldest


async def _count(db: Database, table: Any, *where: Any) -> int:
    async with db.read() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table).where(*where)) or 0)


async def test_past_the_budget_the_oldest_finished_runs_go_and_the_space_comes_back(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    services: Services = api.app.state.services
    db = services.db
    empty = await _usage(db)
    _template, still_going = await _fill(api)
    full = await _usage(db)
    grown = full.database_bytes - empty.database_bytes
    assert grown > COPIES * 40_000, (empty, full)  # the outputs are in
    # half of what the copies took over what the database took before them
    budget = empty.database_bytes + grown // 2
    finished = await _finished_ids(db)
    assert len(finished) == COPIES + 1 - STILL_GOING

    # no budget: nothing goes ahead of its age
    unbudgeted = RetentionService(db, SystemClock(), 30.0, 7.0)
    assert (await unbudgeted.prune_all()).runs == 0
    assert await unbudgeted.keep_to_budget() == 0
    assert await _finished_ids(db) == finished

    retention = RetentionService(db, SystemClock(), 30.0, 7.0, budget_bytes=budget)
    with caplog.at_level(logging.WARNING, logger="flowhook.retention"):
        done = await retention.prune_all()
    after = await _usage(db)
    print(
        f"{db.driver.name}: budget {budget:,}; before {full} after {after}; "
        f"deleted {done.over_budget} of {len(finished)} finished runs"
    )
    assert done.runs == 0  # none was old enough for retention's age
    assert 0 < done.over_budget < len(finished)
    left = await _finished_ids(db)
    # the oldest finished went first: what is left is the newest, in the same order
    assert left == finished[done.over_budget :]
    assert await _count(db, runs, runs.c.run_id.in_(still_going)) == STILL_GOING
    assert await _count(db, runs) == len(left) + STILL_GOING
    # nothing of the deleted runs is left behind
    assert await _count(db, run_steps, run_steps.c.run_id.in_(finished[: done.over_budget])) == 0
    assert await _count(db, events, events.c.run_id.in_(finished[: done.over_budget])) == 0
    assert after.database_bytes <= budget
    if db.is_sqlite:  # the files themselves shrank: free pages and the WAL given back
        assert after.disk_bytes <= full.disk_bytes - grown // 3, (full, after)
        assert after.free_bytes == 0
        assert after.wal_bytes <= full.wal_bytes
    said = [r.getMessage() for r in caplog.records if r.name == "flowhook.retention"]
    assert any(
        re.search(
            rf"disk budget [\d,.]+ MB: database [\d,.]+ MB; deleted the {done.over_budget:,} "
            r"oldest finished runs \(ahead of their retention age\)",
            m,
        )
        for m in said
    ), said

    # under the budget now: the next pass deletes nothing more (on PostgreSQL too, where the
    # files keep their size and the space vacuum freed is counted as free)
    caplog.clear()
    assert await retention.keep_to_budget() == 0
    assert await _finished_ids(db) == left


async def test_only_runs_still_going_left_it_says_it_cannot_get_under(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    services: Services = api.app.state.services
    db = services.db
    _template, still_going = await _fill(api)
    assert len(still_going) == STILL_GOING
    # a budget of a few bytes: nothing gets under it (the setting's least is 1 MB, which an
    # empty SQLite database is under)
    retention = RetentionService(db, SystemClock(), 30.0, 7.0, budget_bytes=16)
    with caplog.at_level(logging.WARNING, logger="flowhook.retention"):
        deleted = await retention.keep_to_budget()
    assert deleted == COPIES + 1 - STILL_GOING  # every finished run, the template too
    assert await _finished_ids(db) == []
    assert await _count(db, runs) == STILL_GOING  # the runs still going, all kept
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "no finished run is left to delete (only runs still going)" in said, said


async def test_the_health_answer_metrics_and_overview_show_use_against_the_budget(
    settings: Any,
) -> None:
    async with open_api(settings.model_copy(update={"disk_budget_mb": 1})) as api:
        r = await api.client.get("/healthz")
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "ok"
        disk = body["disk"]
        assert disk["budget_bytes"] == 1024 * 1024
        assert disk["database_bytes"] > 0
        assert disk["over_budget"] is (disk["database_bytes"] > 1024 * 1024)

        text = (await api.client.get("/metrics")).text
        figures = dict(
            ln.split(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#")
        )
        assert float(figures["flowhook_database_bytes"]) > 0
        assert float(figures["flowhook_disk_budget_bytes"]) == 1024 * 1024

        page = await _overview(api)
        shown = re.search(r'id="disk-budget">(.*?)</p>', page, re.S)
        assert shown, page
        words = re.sub(r"<[^>]+>", "", shown.group(1))
        assert re.search(r"Disk budget: [\d.]+ (B|KB|MB|GB) of 1.0 MB \(\d+%\)", words), words


async def test_without_a_budget_the_health_answer_says_none(api: Api) -> None:
    disk = (await api.client.get("/healthz")).json()["disk"]
    assert disk["budget_bytes"] is None and disk["over_budget"] is False
    assert disk["database_bytes"] > 0
    page = await _overview(api)
    assert 'id="disk-budget"' not in page
    assert "no disk budget set" in page


async def _overview(api: Api) -> str:
    """The overview page as a signed-in browser gets it."""
    r = await api.client.post(
        "/signin", data={"api_key": api.keys["test"]}, headers={"Origin": "http://flowhook.test"}
    )
    assert r.status_code in (200, 303), r.text
    r = await api.client.get("/overview")
    assert r.status_code == 200, r.text
    return r.text
