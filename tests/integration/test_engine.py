"""The worker running flows end to end through the API: control flow, errors, sandbox."""

from __future__ import annotations

from typing import Any

from tests.conftest import Api


def flow(*steps: dict[str, Any], output: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "t", "steps": list(steps)}
    if output is not None:
        body["output"] = output
    return body


async def run(
    api: Api, definition: dict[str, Any], payload: dict[str, Any] | None = None
) -> dict[str, Any]:
    flow_id = await api.create_flow(definition)
    return await api.wait(await api.execute(flow_id, payload or {}))


async def test_whole_expressions_keep_their_native_type(api: Api) -> None:
    result = await run(
        api,
        flow(
            {
                "id": "t",
                "type": "transform",
                "output": {
                    "n": "{{ payload.n + 1 }}",
                    "list": "{{ payload.items | map('upper') | list }}",
                    "text": "n={{ payload.n }}",
                    "flag": "{{ payload.n > 1 }}",
                    "nested": {"deep": ["{{ payload.n * 10 }}", "plain"]},
                    "none": "{{ none }}",
                },
            }
        ),
        {"n": 2, "items": ["a", "b"]},
    )
    assert result["status"] == "completed"
    assert result["steps"][0]["output"] == {
        "n": 3,
        "list": ["A", "B"],
        "text": "n=2",
        "flag": True,
        "nested": {"deep": [20, "plain"]},
        "none": None,
    }


async def test_condition_skips_to_a_later_step(api: Api) -> None:
    result = await run(
        api,
        flow(
            {"id": "gate", "type": "condition", "if": "{{ payload.vip }}", "then": "vip"},
            {"id": "normal", "type": "transform", "output": {"tier": "normal"}},
            {"id": "vip", "type": "transform", "output": {"tier": "vip"}},
            output={"tier": "{{ steps.vip.output.tier }}", "skipped": "{{ steps.normal.status }}"},
        ),
        {"vip": True},
    )
    assert result["status"] == "completed"
    assert [(s["id"], s["status"]) for s in result["steps"]] == [
        ("gate", "completed"),
        ("normal", "skipped"),
        ("vip", "completed"),
    ]
    assert result["output"] == {"tier": "vip", "skipped": "skipped"}
    assert result["steps_executed"] == 2


async def test_condition_end_finishes_completed_early(api: Api) -> None:
    result = await run(
        api,
        flow(
            {"id": "gate", "type": "condition", "if": "{{ true }}", "then": "end"},
            {"id": "never", "type": "fail", "message": "should not run"},
        ),
    )
    assert result["status"] == "completed"
    assert [s["id"] for s in result["steps"]] == ["gate"]


async def test_fail_step_fails_the_run_with_its_message(api: Api) -> None:
    result = await run(
        api,
        flow(
            {"id": "a", "type": "transform", "output": {"x": 1}},
            {"id": "stop", "type": "fail", "message": "no stock for {{ payload.sku }}"},
            {"id": "after", "type": "transform", "output": {}},
        ),
        {"sku": "A1"},
    )
    assert result["status"] == "failed"
    assert result["error"] == {"type": "fail", "message": "no stock for A1", "step": "stop"}
    assert [s["status"] for s in result["steps"]] == ["completed", "failed"]
    events = (await api.get(f"/api/v1/flows/runs/{result['run_id']}/events")).json()["data"]
    assert [e["event"] for e in events] == [
        "flow.started",
        "flow.step_completed",
        "flow.step_failed",
        "flow.failed",
    ]
    step_failed = events[2]["body"]["payload"]
    assert step_failed["step_id"] == "stop" and step_failed["will_retry"] is False


async def test_an_undefined_value_fails_the_step_with_a_clear_message(api: Api) -> None:
    result = await run(
        api, flow({"id": "a", "type": "transform", "output": {"v": "{{ payload.missing.deeper }}"}})
    )
    assert result["status"] == "failed"
    assert result["error"]["type"] == "expression"
    assert "missing" in result["error"]["message"]
    assert result["error"]["step"] == "a"


async def test_sandbox_escapes_are_refused(api: Api) -> None:
    escapes = [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ payload.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ 'x' * 10000000 }}",
        "{{ 9 ** 99999999 }}",
        "{{ range(10000000) | list }}",
    ]
    for source in escapes:
        result = await run(api, flow({"id": "evil", "type": "transform", "output": {"v": source}}))
        assert result["status"] == "failed", source
        assert result["error"]["type"] == "expression", source


async def test_flow_output_error_fails_the_run(api: Api) -> None:
    result = await run(
        api,
        flow({"id": "a", "type": "transform", "output": {}}, output={"v": "{{ payload.nope.x }}"}),
    )
    assert result["status"] == "failed"
    assert result["error"]["type"] == "expression"
    assert result["error"]["step"] is None
