"""Schedules and odd input over HTTP: payloads the store cannot keep, crons that never fire
or fire too often, and the per-workspace cap."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowhook.config import Settings
from tests.conftest import Api

FLOW: dict[str, Any] = {"name": "n", "steps": [{"id": "a", "type": "transform", "output": {}}]}


async def test_a_schedule_holding_a_30_digit_integer_answers_400(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    body = {"flow_id": flow_id, "cron": "*/5 * * * *", "payload": {"n": 10**30}}
    r = await api.post("/api/v1/schedules", body)
    assert r.status_code == 400 and "64-bit" in r.json()["error"], r.text
    r = await api.post("/api/v1/schedules", {**body, "payload": {"n": 1}})
    assert r.status_code == 201
    r = await api.client.patch(
        f"/api/v1/schedules/{r.json()['id']}", json={"payload": {"n": 10**30}}, headers=api.auth()
    )
    assert r.status_code == 400 and "64-bit" in r.json()["error"], r.text
    assert (await api.get("/api/v1/schedules")).json()["data"][0]["payload"] == {"n": 1}


async def test_a_cron_that_never_fires_answers_400(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    r = await api.post("/api/v1/schedules", {"flow_id": flow_id, "cron": "0 0 31 2 *"})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_request"), r.text
    assert "never fires" in r.json()["error"]


async def test_schedules_keep_the_minimum_interval(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    for cron in ("* * * * * *", "* * * * * */30", "* * * * * 0,59"):
        r = await api.post("/api/v1/schedules", {"flow_id": flow_id, "cron": cron})
        assert (r.status_code, r.json()["code"]) == (400, "invalid_request"), (cron, r.text)
        assert "at least 60 s" in r.json()["error"]
    r = await api.post("/api/v1/schedules", {"flow_id": flow_id, "cron": "* * * * *"})
    assert r.status_code == 201, r.text
    r = await api.client.patch(
        f"/api/v1/schedules/{r.json()['id']}", json={"cron": "* * * * * */5"}, headers=api.auth()
    )
    assert r.status_code == 400 and "at least 60 s" in r.json()["error"], r.text


async def test_a_schedule_made_under_looser_limits_can_still_be_paused(
    api: Api, settings: Settings
) -> None:
    flow_id = await api.create_flow(FLOW)
    services = api.app.state.services
    who = await services.keys.authenticate(api.auth()["Authorization"])
    services.schedules._min_seconds = 1  # as if the limit was lowered, then raised again
    s = await services.schedules.create(who, flow_id=flow_id, cron="* * * * * *")
    services.schedules._min_seconds = settings.min_schedule_seconds
    r = await api.client.patch(
        f"/api/v1/schedules/{s.id}", json={"enabled": False}, headers=api.auth()
    )
    assert r.status_code == 200 and r.json()["enabled"] is False, r.text
    r = await api.client.patch(
        f"/api/v1/schedules/{s.id}", json={"cron": "* * * * * */2"}, headers=api.auth()
    )
    assert r.status_code == 400, r.text


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_schedules": 3})


async def test_schedules_per_workspace_and_mode_are_capped(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    body = {"flow_id": flow_id, "cron": "*/5 * * * *"}
    for _ in range(3):
        assert (await api.post("/api/v1/schedules", body)).status_code == 201
    r = await api.post("/api/v1/schedules", body)
    assert (r.status_code, r.json()["code"]) == (400, "too_many_schedules"), r.text
    assert "3 schedules" in r.json()["error"]
    # Other workspaces and the other mode have their own allowance.
    other = await api.create_flow(FLOW, who="other")
    r = await api.post("/api/v1/schedules", {**body, "flow_id": other}, who="other")
    assert r.status_code == 201, r.text
    live = await api.create_flow(FLOW, who="live")
    r = await api.post("/api/v1/schedules", {**body, "flow_id": live}, who="live")
    assert r.status_code == 201, r.text
    first = (await api.get("/api/v1/schedules")).json()["data"][0]["id"]
    assert (
        await api.client.delete(f"/api/v1/schedules/{first}", headers=api.auth())
    ).status_code == 204
    assert (await api.post("/api/v1/schedules", body)).status_code == 201


async def test_concurrent_creates_do_not_pass_the_cap(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    body = {"flow_id": flow_id, "cron": "*/5 * * * *"}
    answers = await asyncio.gather(*(api.post("/api/v1/schedules", body) for _ in range(8)))
    assert sorted(r.status_code for r in answers) == [201] * 3 + [400] * 5
    assert len((await api.get("/api/v1/schedules")).json()["data"]) == 3
