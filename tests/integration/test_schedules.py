"""Schedules: exactly one run per tick across schedulers, daylight saving, missed ticks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from flowhook.clock import FakeClock
from flowhook.config import Settings
from flowhook.cron import next_tick
from flowhook.service import Principal, Services
from flowhook.store.db import Database
from flowhook.store.models import Mode
from flowhook.store.wakeup import Wakeup
from tests.conftest import Api

FLOW: dict[str, Any] = {"name": "tick", "steps": [{"id": "a", "type": "transform", "output": {}}]}


async def test_two_schedulers_start_exactly_one_run_per_tick(
    settings: Settings, db: Database
) -> None:
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC))
    settings = settings.model_copy(update={"min_schedule_seconds": 1})  # every second
    first = Services(db, clock, settings, Wakeup())
    other_db = Database(settings.database_url, sqlite_synchronous="NORMAL")
    second = Services(other_db, clock, settings, Wakeup())
    try:
        key = await first.keys.create(Mode.TEST, "w")
        who = await first.keys.authenticate(f"Bearer {key.key}")
        flow = await first.flows.create(who, FLOW)
        await first.schedules.create(
            who, flow_id=flow.flow_id, cron="* * * * * *", payload={"x": 1}
        )
        for _ in range(10):
            clock.advance(1)
            await asyncio.gather(first.schedules.tick(), second.schedules.tick())
        page = await first.runs.list(who, limit=100, cursor=None)
        assert len(page.data) == 10
        assert {r.trigger for r in page.data} == {"schedule"}
        assert all(r.payload == {"x": 1} for r in page.data)
    finally:
        await other_db.dispose()


async def test_missed_ticks_are_skipped_not_burst(services: Services) -> None:
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    services.schedules._clock = clock  # type: ignore[attr-defined]
    key = await services.keys.create(Mode.TEST, "w")
    who: Principal = await services.keys.authenticate(f"Bearer {key.key}")
    flow = await services.flows.create(who, FLOW)
    s = await services.schedules.create(who, flow_id=flow.flow_id, cron="* * * * *")
    assert s.next_run_at == datetime(2026, 5, 1, 12, 1, tzinfo=UTC)
    clock.advance(30)
    assert await services.schedules.tick() == 1  # on time
    clock.advance(600)  # the scheduler was down for ten minutes
    assert await services.schedules.tick() == 0
    after = await services.schedules.get(who, s.id)
    assert after.next_run_at > clock.now()
    assert len((await services.runs.list(who, limit=100, cursor=None)).data) == 1


async def test_a_tick_whose_payload_fails_the_flows_schema_starts_no_run(
    services: Services, caplog: Any
) -> None:
    """The flow gained an ``input_schema`` its schedule's payload does not meet: each tick
    is skipped with the reason logged, and the schedule goes on to its next tick."""
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    services.schedules._clock = clock  # type: ignore[attr-defined]
    key = await services.keys.create(Mode.TEST, "w")
    who: Principal = await services.keys.authenticate(f"Bearer {key.key}")
    flow = await services.flows.create(who, FLOW)
    s = await services.schedules.create(who, flow_id=flow.flow_id, cron="* * * * *")
    schema = {"type": "object", "required": ["region"]}
    await services.flows.update(who, flow.flow_id, {**FLOW, "input_schema": schema})
    clock.advance(30)
    assert await services.schedules.tick() == 0
    assert "payload.region" in caplog.text and s.id in caplog.text
    assert (await services.runs.list(who, limit=10, cursor=None)).data == []
    assert (await services.schedules.get(who, s.id)).next_run_at > clock.now()


def test_daylight_saving_spring_gap_and_autumn_repeat() -> None:
    berlin = "Europe/Berlin"
    # 29 March 2026: 02:00 → 03:00 local. A 02:30 job runs at 03:00 local (01:00 UTC).
    spring = next_tick("30 2 * * *", berlin, datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    assert spring == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    # 25 October 2026: 03:00 → 02:00 local, 02:30 happens twice; the job runs once that day.
    start = datetime(2026, 10, 24, 12, 0, tzinfo=UTC)
    ticks = []
    at = start
    for _ in range(3):
        at = next_tick("30 2 * * *", berlin, at)
        ticks.append(at)
    assert [t.date().isoformat() for t in ticks] == ["2026-10-25", "2026-10-26", "2026-10-27"]
    # A daily 09:00 job follows local time across the change (UTC offset moves by an hour).
    summer = next_tick("0 9 * * *", berlin, datetime(2026, 10, 24, 0, 0, tzinfo=UTC))
    winter = next_tick("0 9 * * *", berlin, summer + timedelta(minutes=1))
    assert (summer.hour, winter.hour) == (7, 8)


async def test_schedule_api(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    r = await api.post(
        "/api/v1/schedules",
        {"flow_id": flow_id, "cron": "*/5 * * * *", "timezone": "Europe/Berlin"},
    )
    assert r.status_code == 201
    s = r.json()
    assert s["id"].startswith("sch_") and s["next_run_at"].endswith("Z")
    for bad, field in (
        ({"cron": "every day"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "zone"),
    ):
        r = await api.post("/api/v1/schedules", {"flow_id": flow_id, **bad})
        assert r.status_code == 400 and field in r.json()["error"], r.text
    r = await api.client.patch(
        f"/api/v1/schedules/{s['id']}", json={"enabled": False}, headers=api.auth()
    )
    assert r.json()["enabled"] is False and r.json()["next_run_at"] is None
    for empty in ({"cron": ""}, {"timezone": ""}):  # was taken for "unchanged": 200
        r = await api.client.patch(f"/api/v1/schedules/{s['id']}", json=empty, headers=api.auth())
        assert r.status_code == 400 and next(iter(empty)) in r.json()["error"], r.text
    assert (await api.get(f"/api/v1/schedules/{s['id']}", who="live")).status_code == 404
    assert (
        await api.client.delete(f"/api/v1/schedules/{s['id']}", headers=api.auth())
    ).status_code == 204
