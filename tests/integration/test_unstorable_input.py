"""JSON a parser reads but the store cannot write back (300-deep nesting, NaN, a 30-digit
integer) answers 400 on execute and on flows, and never fails another caller's request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import Api

FLOW: dict[str, Any] = {"name": "n", "steps": [{"id": "a", "type": "transform", "output": {}}]}
DEEP = b'{"a":' * 300 + b"1" + b"}" * 300
BAD_PAYLOADS = {
    # orjson reads it (the fast path), cannot write it back
    "deep": b'{"flow_id": "%s", "payload": ' + DEEP + b"}",
    # the FastAPI route's parser reads these
    "nan": b'{"flow_id": "%s", "payload": {"x": NaN}}',
    "infinity": b'{"flow_id": "%s", "payload": {"x": [-Infinity]}}',
    "surrogate": b'{"flow_id": "%s", "payload": {"x": "\\ud800"}}',
    # orjson would read it as a float: the fast path leaves it to the model's parser
    "big_int": b'{"flow_id": "%s", "payload": {"n": 123456789012345678901234567890}}',
    "negative_big_int": b'{"flow_id": "%s", "payload": {"n": [-99999999999999999999]}}',
    # PostgreSQL's jsonb refuses it
    "nul": b'{"flow_id": "%s", "payload": {"x": "a\\u0000b"}}',
}


async def execute_raw(api: Api, body: bytes, who: str = "test") -> Any:
    return await api.client.post(
        "/api/v1/flows/execute",
        content=body,
        headers={**api.auth(who), "Content-Type": "application/json"},
    )


@pytest.mark.parametrize("name", sorted(BAD_PAYLOADS))
async def test_an_unstorable_payload_answers_400(api: Api, name: str) -> None:
    flow_id = await api.create_flow(FLOW)
    r = await execute_raw(api, BAD_PAYLOADS[name] % flow_id.encode())
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_request" and r.json()["error"].startswith("payload ")
    assert (await api.get("/api/v1/flows/runs")).json()["data"] == []


async def test_long_digit_runs_that_fit_are_kept_exactly(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    payload = {"max": 2**64 - 1, "min": -(2**63), "card": "12345678901234567890123", "f": 0.1}
    r = await api.post("/api/v1/flows/execute", {"flow_id": flow_id, "payload": payload})
    assert r.status_code == 202, r.text
    run = (await api.get(f"/api/v1/flows/runs/{r.json()['run_id']}")).json()
    assert run["payload"] == payload


async def test_bad_payloads_do_not_fail_another_workspaces_executes(api: Api) -> None:
    mine = await api.create_flow(FLOW)
    theirs = await api.create_flow(FLOW, who="other")
    good = b'{"flow_id": "%s", "payload": {"n": 1}}' % theirs.encode()
    bad = BAD_PAYLOADS["deep"] % mine.encode()
    for _ in range(3):
        answers = await asyncio.gather(
            *(
                execute_raw(api, bad) if i % 6 == 0 else execute_raw(api, good, who="other")
                for i in range(36)
            )
        )
        codes = [r.status_code for r in answers]
        assert codes[::6] == [400] * 6, [r.text for r in answers[::6]]
        good_codes = [c for i, c in enumerate(codes) if i % 6]
        assert good_codes == [202] * 30, [r.text for r in answers if r.status_code != 202]


async def test_a_flow_holding_a_30_digit_integer_answers_400(api: Api) -> None:
    definition = {
        "name": "big",
        "steps": [{"id": "a", "type": "transform", "output": {"n": 10**30}}],
    }
    r = await api.post("/api/v1/flows", definition)
    assert r.status_code == 400, r.text
    assert "64-bit" in r.json()["error"] and r.json()["code"] == "invalid_request"
    flow_id = await api.create_flow(FLOW)
    r = await api.client.put(f"/api/v1/flows/{flow_id}", json=definition, headers=api.auth())
    assert r.status_code == 400, r.text
    assert (await api.get(f"/api/v1/flows/{flow_id}")).json()["version"] == 1
