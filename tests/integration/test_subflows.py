"""``flow`` steps (sub-flows) on both backends: a child run waited for or not, a child that
fails or is cancelled, a parent cancelled or out of time while its child runs, a flow that is
not this workspace's and mode's, and recursion stopped at depth 10."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.conftest import Api


def waiting_child() -> dict[str, Any]:
    """A child that waits for a signal no one sends."""
    return {
        "name": "child that waits",
        "steps": [{"id": "hold", "type": "wait", "signal": "never.sent"}],
    }


def caller(flow_id: str, **step: Any) -> dict[str, Any]:
    return {
        "name": "parent",
        "steps": [
            {"id": "ship", "type": "flow", "flow_id": flow_id, **step},
            {"id": "after", "type": "transform", "output": {"got": "{{ steps.ship.output }}"}},
        ],
        "output": {"result": "{{ steps.after.output.got }}"},
    }


async def child_of(api: Api, run_id: str) -> str:
    """The child run a parent's ``flow`` step started, once it did."""
    async with asyncio.timeout(10):
        while True:
            run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
            for step in run["steps"]:
                if step["type"] == "flow" and step["output"] and "run_id" in step["output"]:
                    return str(step["output"]["run_id"])
            await asyncio.sleep(0.02)


async def test_a_parent_waits_for_its_child_and_takes_its_output(api: Api) -> None:
    child_flow = await api.create_flow(
        {
            "name": "shipping",
            "steps": [{"id": "label", "type": "transform", "output": {"n": "{{ payload.n * 2 }}"}}],
            "output": {"label": "L-{{ steps.label.output.n }}"},
        }
    )
    parent_flow = await api.create_flow(caller(child_flow, payload={"n": "{{ payload.n }}"}))
    run_id = await api.execute(parent_flow, {"n": 21})
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    assert done["output"] == {"result": {"label": "L-42"}}
    ship = done["steps"][0]
    assert (ship["id"], ship["type"], ship["status"]) == ("ship", "flow", "completed")
    listed = (await api.get("/api/v1/flows/runs", params={"flow_id": child_flow})).json()
    [child] = listed["data"]
    assert child["status"] == "completed" and child["trigger"] == "flow"
    assert child["parent_run_id"] == run_id and child["payload"] == {"n": 21}
    assert done["parent_run_id"] is None


async def test_without_wait_the_parent_goes_on_with_the_child_s_id(api: Api) -> None:
    child_flow = await api.create_flow(waiting_child())
    parent_flow = await api.create_flow(caller(child_flow, wait=False))
    run_id = await api.execute(parent_flow)
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    child_id = done["output"]["result"]["run_id"]
    child = (await api.get(f"/api/v1/flows/runs/{child_id}")).json()
    assert child["status"] in ("queued", "running") and child["parent_run_id"] == run_id
    assert (await api.post(f"/api/v1/flows/runs/{child_id}/cancel")).status_code in (200, 202)


async def test_a_failed_child_fails_the_step_and_the_parent(api: Api) -> None:
    child_flow = await api.create_flow(
        {"name": "broken", "steps": [{"id": "boom", "type": "fail", "message": "no stock"}]}
    )
    parent_flow = await api.create_flow(caller(child_flow))
    done = await api.wait(await api.execute(parent_flow))
    assert done["status"] == "failed", done
    assert done["error"]["type"] == "child_failed" and done["error"]["step"] == "ship"
    assert "no stock" in done["error"]["message"]
    assert done["error"]["run_id"].startswith("run_")


async def test_a_child_cancelled_by_hand_fails_its_waiting_parent(api: Api) -> None:
    parent_flow = await api.create_flow(caller(await api.create_flow(waiting_child())))
    run_id = await api.execute(parent_flow)
    child_id = await child_of(api, run_id)
    await asyncio.sleep(0.2)  # the child reaches its wait and sleeps
    assert (await api.post(f"/api/v1/flows/runs/{child_id}/cancel")).status_code in (200, 202)
    done = await api.wait(run_id)
    assert done["status"] == "failed" and done["error"]["type"] == "child_cancelled", done


async def test_cancelling_a_parent_cancels_its_child(api: Api) -> None:
    parent_flow = await api.create_flow(caller(await api.create_flow(waiting_child())))
    run_id = await api.execute(parent_flow)
    child_id = await child_of(api, run_id)
    await asyncio.sleep(0.2)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert r.status_code in (200, 202), r.text
    assert (await api.wait(run_id))["status"] == "cancelled"
    child = await api.wait(child_id)
    assert child["status"] == "cancelled"
    events = (await api.get(f"/api/v1/flows/runs/{child_id}/events")).json()["data"]
    assert [e["event"] for e in events][-1] == "flow.cancelled"


async def test_a_child_that_outlasts_the_step_s_timeout_is_cancelled(api: Api) -> None:
    child_flow = await api.create_flow(waiting_child())
    parent_flow = await api.create_flow(caller(child_flow, timeout_seconds=0.5))
    run_id = await api.execute(parent_flow)
    done = await api.wait(run_id)
    assert done["status"] == "failed" and done["error"]["type"] == "timeout", done
    child = await api.wait(done["error"]["run_id"])
    assert child["status"] == "cancelled"


async def test_a_flow_of_another_workspace_or_mode_is_not_found(api: Api) -> None:
    elsewhere = await api.create_flow(waiting_child(), who="other")
    live = await api.create_flow(waiting_child(), who="live")
    for flow_id in (elsewhere, live, "wf_0000000000000000000000000z"):
        parent_flow = await api.create_flow(caller(flow_id))
        done = await api.wait(await api.execute(parent_flow))
        assert done["status"] == "failed", done
        assert done["error"]["type"] == "flow_not_found"
        assert done["error"]["message"] == f"flow {flow_id!r} not found"


async def test_recursion_stops_at_depth_ten(api: Api) -> None:
    flow_id = await api.create_flow(waiting_child())
    r = await api.client.put(
        f"/api/v1/flows/{flow_id}",
        json={
            "name": "forever",
            "steps": [{"id": "again", "type": "flow", "flow_id": flow_id}],
        },
        headers=api.auth(),
    )
    assert r.status_code == 200, r.text
    root = await api.wait(await api.execute(flow_id), timeout=30)
    assert root["status"] == "failed" and root["error"]["type"] == "child_failed", root
    depth, run = 0, root
    while run["error"]["type"] == "child_failed":
        run = await api.wait(run["error"]["run_id"])
        depth += 1
    assert depth == 10
    assert run["error"]["type"] == "flow_depth" and "deeper than 10" in run["error"]["message"]


async def test_a_flow_step_is_validated(api: Api) -> None:
    r = await api.post(
        "/api/v1/flows",
        {"name": "x", "steps": [{"id": "s", "type": "flow", "flow_id": "wf_nope", "retry": {}}]},
    )
    assert r.status_code == 400
    assert "step 's' (steps[0])" in r.json()["error"]


async def test_a_rerun_after_a_flow_step_reuses_its_child_s_output(api: Api) -> None:
    child = await api.create_flow(
        {"name": "child", "steps": [{"id": "c", "type": "transform",
                                     "output": {"n": "{{ payload.n }}"}}],
         "output": {"n": "{{ steps.c.output.n }}"}}
    )  # fmt: skip
    flow = {
        "name": "parent",
        "steps": [
            {"id": "ship", "type": "flow", "flow_id": child, "payload": {"n": "{{ payload.n }}"}},
            {"id": "gate", "type": "condition", "if": "{{ payload.ok }}", "else": "fail"},
            {"id": "after", "type": "transform", "output": {"got": "{{ steps.ship.output.n }}"}},
        ],
        "output": {"got": "{{ steps.after.output.got }}"},
    }
    failed = await api.wait(await api.execute(await api.create_flow(flow), {"n": 7, "ok": False}))
    assert failed["status"] == "failed" and failed["error"]["step"] == "gate", failed
    r = await api.post(
        f"/api/v1/flows/runs/{failed['run_id']}/rerun", {"payload": {"n": 8, "ok": True}}
    )
    assert r.status_code == 202, r.text
    again = await api.wait(r.json()["run_id"])
    assert again["status"] == "completed" and again["output"] == {"got": 7}, again
    assert again["steps"][0]["reused"] is True
    children = (await api.get("/api/v1/flows/runs", params={"flow_id": child})).json()["data"]
    assert [c["parent_run_id"] for c in children] == [failed["run_id"]]  # no second child
    r = await api.post(
        f"/api/v1/flows/runs/{failed['run_id']}/rerun",
        {"from_step": "ship", "payload": {"n": 8, "ok": True}},
    )
    whole = await api.wait(r.json()["run_id"])
    assert whole["status"] == "completed" and whole["output"] == {"got": 8}, whole
    children = (await api.get("/api/v1/flows/runs", params={"flow_id": child})).json()["data"]
    assert sorted(c["parent_run_id"] for c in children) == sorted(
        [failed["run_id"], whole["run_id"]]
    )
