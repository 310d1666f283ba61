"""W3C Trace Context on both backends, over real HTTP to the receivers: a run started with a
``traceparent`` keeps its trace id, which every ``http`` step request and every webhook
delivery of the run carries with a span id of its own; an invalid one is ignored and the run
gets a new trace; child runs, parts, reruns and inbound hooks' runs stay in their trace."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.conftest import Api, Receiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
_HEADER = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$")


async def until(check: Any, timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        while not (value := check()):
            await asyncio.sleep(0.02)
        return value


def traced(request: dict[str, Any]) -> tuple[str, str, str]:
    """(trace id, span id, flags) of a request's ``traceparent``, which must be well formed."""
    value = {k.lower(): v for k, v in request["headers"].items()}.get("traceparent", "")
    m = _HEADER.match(value)
    assert m is not None, f"no valid traceparent in {request['headers']}"
    return m.group(1), m.group(2), m.group(3)


async def execute(api: Api, flow_id: str, traceparent: str | None, **body: Any) -> str:
    headers = {"traceparent": traceparent} if traceparent is not None else {}
    r = await api.post(
        "/api/v1/flows/execute", {"flow_id": flow_id, "payload": {}, **body}, headers=headers
    )
    assert r.status_code == 202, r.text
    return str(r.json()["run_id"])


def http_flow(url: str) -> dict[str, Any]:
    return {
        "name": "traced",
        "steps": [
            {"id": "call", "type": "http", "request": {"method": "POST", "url": url, "json": {}}},
            {"id": "again", "type": "http", "request": {"url": url}},
        ],
    }


async def endpoint(api: Api, url: str, events: list[str]) -> None:
    r = await api.post("/api/v1/webhooks/endpoints", {"url": url, "events": events})
    assert r.status_code == 201, r.text


async def test_a_known_traceparent_reaches_http_steps_and_webhooks(
    api: Api, receiver: Receiver
) -> None:
    flow_id = await api.create_flow(http_flow(receiver.url + "/step"))
    await endpoint(api, receiver.url + "/hook", ["flow.started", "flow.completed"])
    run_id = await execute(api, flow_id, TRACEPARENT)
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    assert done["trace_id"] == TRACE
    hooks = await until(lambda: len([r for r in receiver.requests if r["path"] == "/hook"]) >= 2 and [r for r in receiver.requests if r["path"] == "/hook"])  # fmt: skip
    steps = [r for r in receiver.requests if r["path"] == "/step"]
    assert len(steps) == 2
    seen = [traced(r) for r in steps + hooks]
    assert {t for t, _, _ in seen} == {TRACE}
    assert {f for _, _, f in seen} == {"01"}
    spans = [s for _, s, _ in seen]
    assert len(set(spans)) == len(spans) and PARENT not in spans  # each its own span


async def test_the_fastapi_route_keeps_the_traceparent_too(api: Api, receiver: Receiver) -> None:
    # ``priority`` makes the plain-ASGI execute path hand the request to the FastAPI route
    flow_id = await api.create_flow(http_flow(receiver.url + "/step"))
    run_id = await execute(api, flow_id, TRACEPARENT, priority=5)
    assert (await api.wait(run_id))["trace_id"] == TRACE
    assert {traced(r)[0] for r in receiver.requests} == {TRACE}


@pytest.mark.parametrize(
    "invalid",
    [
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE.upper()}-{PARENT}-01",  # upper case
        f"ff-{TRACE}-{PARENT}-01",  # version ff
        f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE[:-1]}-{PARENT}-01",  # short
        "garbage",
    ],
)
async def test_an_invalid_traceparent_is_ignored_and_a_new_trace_made(
    api: Api, receiver: Receiver, invalid: str
) -> None:
    flow_id = await api.create_flow(http_flow(receiver.url))
    run_id = await execute(api, flow_id, invalid)
    done = await api.wait(run_id)
    assert done["status"] == "completed"
    trace_id = done["trace_id"]
    assert re.fullmatch("[0-9a-f]{32}", trace_id) and trace_id not in (TRACE, "0" * 32)
    assert {traced(r)[0] for r in receiver.requests} == {trace_id}


async def test_without_a_traceparent_each_run_has_a_trace_of_its_own(
    api: Api, receiver: Receiver
) -> None:
    flow_id = await api.create_flow(http_flow(receiver.url))
    first, second = [await execute(api, flow_id, None) for _ in range(2)]
    traces = [(await api.wait(run_id))["trace_id"] for run_id in (first, second)]
    assert traces[0] != traces[1]
    assert {traced(r)[0] for r in receiver.requests} == set(traces)
    # the same trace id on every read: it is the run's
    assert (await api.get(f"/api/v1/flows/runs/{first}")).json()["trace_id"] == traces[0]


async def test_children_parts_and_reruns_stay_in_the_run_s_trace(
    api: Api, receiver: Receiver
) -> None:
    child = await api.create_flow(http_flow(receiver.url + "/child"))
    parent = await api.create_flow(
        {
            "name": "parent",
            "steps": [
                {"id": "sub", "type": "flow", "flow_id": child},
                {"id": "fan", "type": "parallel", "branches": {
                    "a": [{"id": "a_call", "type": "http", "request": {"url": receiver.url + "/a"}}],
                    "b": [{"id": "b_call", "type": "http", "request": {"url": receiver.url + "/b"}}],
                }},
                {"id": "each", "type": "map", "items": "{{ [1, 2] }}", "steps": [
                    {"id": "item_call", "type": "http", "request": {"url": receiver.url + "/item"}},
                ]},
            ],
        }
    )  # fmt: skip
    run_id = await execute(api, parent, TRACEPARENT)
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    paths = sorted(r["path"] for r in receiver.requests)
    assert paths == ["/a", "/b", "/child", "/child", "/item", "/item"]
    assert {traced(r)[0] for r in receiver.requests} == {TRACE}
    assert len({traced(r)[1] for r in receiver.requests}) == 6
    [child_run] = (await api.get("/api/v1/flows/runs", params={"flow_id": child})).json()["data"]
    assert child_run["trace_id"] == TRACE
    r = await api.post(f"/api/v1/flows/runs/{run_id}/rerun", {"from_step": "fan"})
    assert r.status_code == 202, r.text
    rerun = await api.wait(r.json()["run_id"])
    assert rerun["status"] == "completed" and rerun["trace_id"] == TRACE
    assert {traced(r)[0] for r in receiver.requests} == {TRACE}


async def test_an_inbound_hook_s_run_takes_the_sender_s_traceparent(
    api: Api, receiver: Receiver
) -> None:
    flow_id = await api.create_flow(http_flow(receiver.url))
    r = await api.post("/api/v1/hooks", {"flow_id": flow_id})
    assert r.status_code == 201, r.text
    path = "/api/v1/hooks/" + r.json()["id"]
    r = await api.client.post(path, json={"a": 1}, headers={"traceparent": TRACEPARENT})
    assert r.status_code == 202, r.text
    run_id = r.json()["run_id"]
    assert (await api.wait(run_id))["trace_id"] == TRACE
    assert {traced(r)[0] for r in receiver.requests} == {TRACE}
