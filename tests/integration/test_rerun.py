"""Rerun a finished run from a step (DESIGN.md, "Rerun from a step"), on both backends: the
steps before it are reused, not run again, and raise no events."""

from __future__ import annotations

from typing import Any

from tests.conftest import Api, Receiver


def order_flow(url: str, *, ship_path: str = "/ship") -> dict[str, Any]:
    """Charge, e-mail, ship: three calls to the outside, the third of which may fail."""

    def call(step_id: str, path: str, **extra: Any) -> dict[str, Any]:
        request = {"method": "POST", "url": url + path, "json": {"order": "{{ payload.order }}"}}
        return {"id": step_id, "type": "http", "request": request, **extra}

    return {
        "name": "order",
        "steps": [
            call("charge", "/charge"),
            call("email", "/email"),
            call("ship", ship_path),
            {
                "id": "done",
                "type": "transform",
                "output": {"charged": "{{ steps.charge.output.json.n }}"},
            },
        ],
        "output": {"charged": "{{ steps.done.output.charged }}", "order": "{{ payload.order }}"},
    }


def paths(receiver: Receiver) -> list[str]:
    return [r["path"] for r in receiver.requests]


async def failed_at_ship(api: Api, receiver: Receiver) -> tuple[str, str]:
    """A run that charged and e-mailed, then failed at ``ship`` (the carrier was down)."""
    receiver.script = [(200, {"n": 1}), (200, {"n": 2}), (503, {"down": True})]
    flow_id = await api.create_flow(order_flow(receiver.url))
    run_id = await api.execute(flow_id, {"order": "o1"})
    run = await api.wait(run_id)
    assert run["status"] == "failed" and run["error"]["step"] == "ship", run
    return flow_id, run_id


async def rerun(api: Api, run_id: str, body: Any = None, **kw: Any) -> Any:
    return await api.post(f"/api/v1/flows/runs/{run_id}/rerun", body, **kw)


async def test_rerun_from_the_failed_step_does_not_repeat_the_steps_before_it(
    api: Api, receiver: Receiver
) -> None:
    _, original = await failed_at_ship(api, receiver)
    r = await rerun(api, original)
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["status"] == "queued" and answer["rerun_of"] == original
    assert answer["run_id"].startswith("run_") and answer["run_id"] != original
    run = await api.wait(answer["run_id"])
    assert run["status"] == "completed", run
    assert paths(receiver) == ["/charge", "/email", "/ship", "/ship"]  # no second charge
    assert run["rerun_of"] == original and run["trigger"] == "rerun"
    assert [(s["id"], s["status"], s["reused"]) for s in run["steps"]] == [
        ("charge", "completed", True),
        ("email", "completed", True),
        ("ship", "completed", False),
        ("done", "completed", False),
    ]
    assert run["steps"][0]["output"]["json"] == {"n": 1}  # the original's output
    assert run["output"] == {"charged": 1, "order": "o1"}  # later steps see reused outputs
    assert run["steps_executed"] == 2
    events = (await api.get(f"/api/v1/flows/runs/{run['run_id']}/events")).json()["data"]
    assert [(e["event"], e["body"]["payload"].get("step_id")) for e in events] == [
        ("flow.started", None),
        ("flow.step_completed", "ship"),
        ("flow.step_completed", "done"),
        ("flow.completed", None),
    ]
    first = (await api.get(f"/api/v1/flows/runs/{original}")).json()
    assert first["rerun_of"] is None and first["status"] == "failed"  # the original is untouched


async def test_rerun_from_a_named_step_on_the_latest_version_with_a_new_payload(
    api: Api, receiver: Receiver
) -> None:
    flow_id, original = await failed_at_ship(api, receiver)
    fixed = order_flow(receiver.url, ship_path="/ship-v2")
    r = await api.client.put(f"/api/v1/flows/{flow_id}", json=fixed, headers=api.auth())
    assert r.status_code == 200, r.text
    receiver.default = (200, {"n": 9})
    body = {"from_step": "email", "flow_version": "latest", "payload": {"order": "o2"}}
    r = await rerun(api, original, body)
    assert r.status_code == 202, r.text
    run = await api.wait(r.json()["run_id"])
    assert run["status"] == "completed", run
    assert run["flow_version"] == 2 and run["payload"] == {"order": "o2"}
    assert paths(receiver)[3:] == ["/email", "/ship-v2"]
    assert receiver.requests[3]["body"] == b'{"order":"o2"}'
    assert [(s["id"], s["reused"]) for s in run["steps"]] == [
        ("charge", True),
        ("email", False),
        ("ship", False),
        ("done", False),
    ]
    assert run["output"] == {"charged": 1, "order": "o2"}

    # the same rerun on version 1, explicitly, runs the old definition
    r = await rerun(api, original, {"flow_version": 1})
    v1 = await api.wait(r.json()["run_id"])
    assert v1["flow_version"] == 1 and paths(receiver)[-1] == "/ship"


async def test_rerun_of_a_completed_run_starts_at_the_first_step(
    api: Api, receiver: Receiver
) -> None:
    receiver.default = (200, {"n": 5})
    flow_id = await api.create_flow(order_flow(receiver.url))
    done = await api.wait(await api.execute(flow_id, {"order": "o3"}))
    assert done["status"] == "completed"
    r = await rerun(api, done["run_id"])
    again = await api.wait(r.json()["run_id"])
    assert again["status"] == "completed"
    assert [s["reused"] for s in again["steps"]] == [False] * 4
    assert paths(receiver) == ["/charge", "/email", "/ship"] * 2
    # a rerun of a rerun reuses what the rerun reused
    r = await rerun(api, again["run_id"], {"from_step": "done"})
    third = await api.wait(r.json()["run_id"])
    assert [s["reused"] for s in third["steps"]] == [True, True, True, False]
    assert len(receiver.requests) == 6


async def test_refusals_name_the_step_and_the_state(api: Api, receiver: Receiver) -> None:
    _, original = await failed_at_ship(api, receiver)
    r = await rerun(api, original, {"from_step": "nope"})
    assert r.status_code == 400 and "'nope'" in r.json()["error"], r.text
    assert "charge, email, ship, done" in r.json()["error"]
    r = await rerun(api, original, {"from_step": "done"})
    assert r.status_code == 400 and "'ship'" in r.json()["error"], r.text
    r = await rerun(api, original, {"flow_version": 7})
    assert r.status_code == 400 and "no version 7" in r.json()["error"], r.text
    for bad in ({"flow_version": "newest"}, {"flow_version": 0}, {"extra": 1}, [1]):
        r = await rerun(api, original, bad)
        assert r.status_code in (400, 422), (bad, r.text)
    r = await rerun(api, "run_doesnotexist")
    assert r.status_code == 404
    r = await rerun(api, original, who="other")  # another workspace sees no such run
    assert r.status_code == 404
    assert len(receiver.requests) == 3  # nothing ran

    slow = await api.create_flow(
        {"name": "slow", "steps": [{"id": "z", "type": "delay", "seconds": 60}]}
    )
    waiting = await api.execute(slow)
    r = await rerun(api, waiting)
    assert r.status_code == 409 and r.json()["code"] == "run_not_finished", r.text
    r = await api.post(f"/api/v1/flows/runs/{waiting}/cancel")
    assert r.status_code in (200, 202)
    cancelled = await api.wait(waiting)
    assert cancelled["status"] == "cancelled"
    r = await rerun(api, waiting)  # a cancelled run can be rerun
    assert r.status_code == 202, r.text


async def test_idempotency_key_gives_the_same_rerun(api: Api, receiver: Receiver) -> None:
    _, original = await failed_at_ship(api, receiver)
    key = {"Idempotency-Key": "rerun-1"}
    first = await rerun(api, original, {"from_step": "ship"}, headers=key)
    again = await rerun(api, original, {"from_step": "ship"}, headers=key)
    assert first.status_code == again.status_code == 202
    assert first.json()["run_id"] == again.json()["run_id"]
    other = await rerun(api, original, {"from_step": "email"}, headers=key)
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    await api.wait(first.json()["run_id"])
    assert paths(receiver).count("/ship") == 2


async def test_a_rerun_is_paced_like_an_execute_of_its_flow(api: Api) -> None:
    """A rerun of a keyed flow takes its key and priority from its payload: it waits for
    the slot of its customer that another run holds, instead of slipping past the limit."""
    import asyncio

    flow_id = await api.create_flow(
        {
            "name": "sync",
            "concurrency": {"limit": 1, "key": "{{ payload.customer }}"},
            "priority": 7,
            "steps": [{"id": "sync", "type": "delay", "seconds": 0.6}],
        }
    )
    first = await api.execute(flow_id, {"customer": "cus_1"})
    assert (await api.wait(first))["status"] == "completed"
    busy = await api.execute(flow_id, {"customer": "cus_1"})
    r = await rerun(api, first)
    assert r.status_code == 202, r.text
    again = r.json()["run_id"]
    async with asyncio.timeout(10):
        while True:
            record = (await api.get(f"/api/v1/flows/runs/{again}")).json()
            held = (record["waiting_for"] or {}).get("reason") == "concurrency"
            if held or record["status"] != "queued":
                break
            await asyncio.sleep(0.02)
    assert record["priority"] == 7
    assert record["waiting_for"] is not None, record
    assert (record["waiting_for"]["reason"], record["waiting_for"]["key"]) == (
        "concurrency",
        "cus_1",
    )
    held_behind, done = await api.wait(busy), await api.wait(again)
    assert done["status"] == "completed"
    assert done["started_at"] >= held_behind["finished_at"]
