"""``task`` steps and the worker protocol on both backends: claim, heartbeat, complete and
fail over the API; retries, a lease that runs out, an attempt's timeout, cancel, isolation,
tasks inside ``map`` and ``parallel``, and the SDK's ``Worker`` against the app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from flowhook.client import NonRetryableError, TaskContext, Worker
from flowhook.clock import FakeClock
from flowhook.config import Settings
from tests.conftest import Api, open_api


def task_flow(**step: Any) -> dict[str, Any]:
    return {
        "name": "charge",
        "steps": [
            {"id": "charge", "type": "task", "task": "payments.charge",
             "input": {"amount": "{{ payload.amount }}"}, **step},
            {"id": "after", "type": "transform", "output": {"id": "{{ steps.charge.output.id }}"}},
        ],
        "output": {"id": "{{ steps.after.output.id }}"},
    }  # fmt: skip


async def claim(api: Api, who: str = "test", wait: float = 5, **body: Any) -> list[dict[str, Any]]:
    payload = {"worker_id": "w1", "tasks": ["payments.charge"], "wait_seconds": wait, **body}
    r = await api.post("/api/v1/tasks/claim", payload, who=who)
    assert r.status_code == 200, r.text
    return list(r.json()["tasks"])


async def run_of(api: Api, run_id: str) -> dict[str, Any]:
    r = await api.get(f"/api/v1/flows/runs/{run_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_a_worker_claims_completes_and_the_run_goes_on(api: Api) -> None:
    flow_id = await api.create_flow(task_flow())
    run_id = await api.execute(flow_id, {"amount": 42})
    [task] = await claim(api)
    assert task["task"] == "payments.charge" and task["attempt"] == 1
    assert task["input"] == {"amount": 42}
    assert (task["run_id"], task["flow_id"], task["step_id"]) == (run_id, flow_id, "charge")
    assert task["task_id"].startswith("tsk_") and task["lease_expires_at"].endswith("Z")
    r = await api.post(f"/api/v1/tasks/{task['task_id']}/heartbeat", {"attempt": 1})
    assert r.status_code == 200 and r.json()["cancel_requested"] is False, r.text
    done = {"attempt": 1, "output": {"id": "ch_1"}}
    r = await api.post(f"/api/v1/tasks/{task['task_id']}/complete", done)
    assert r.status_code == 200, r.text
    assert r.json() == {"task_id": task["task_id"], "status": "completed", "attempt": 1}
    again = await api.post(f"/api/v1/tasks/{task['task_id']}/complete", done)
    assert again.status_code == 200 and again.json() == r.json()  # the same call again
    other = await api.post(f"/api/v1/tasks/{task['task_id']}/complete",
                           {"attempt": 1, "output": {"id": "ch_2"}})  # fmt: skip
    assert other.status_code == 409, other.text
    run = await api.wait(run_id)
    assert run["status"] == "completed" and run["output"] == {"id": "ch_1"}, run
    [step] = [s for s in run["steps"] if s["id"] == "charge"]
    assert step["status"] == "completed" and step["attempts"] == 1
    assert step["output"] == {"id": "ch_1"}
    r = await api.get("/api/v1/workers")
    [worker] = r.json()["workers"]
    assert worker["worker_id"] == "w1" and worker["tasks"] == ["payments.charge"]
    assert worker["in_flight"] == 0


async def batch(api: Api, ends: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    payload = {"worker_id": "w1", "tasks": ["payments.charge"], "ends": ends, **body}
    r = await api.post("/api/v1/tasks/batch", payload)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_a_batch_ends_attempts_each_on_its_own_and_claims_more(
    api: Api, settings: Settings
) -> None:
    flow_id = await api.create_flow(task_flow())
    runs = [await api.execute(flow_id, {"amount": n}) for n in range(5)]
    first: list[dict[str, Any]] = []
    while len(first) < 4:  # each claim answers once one is queued: the runs park one by one
        first += await claim(api, max=4 - len(first))
    ok, failing, big, cancelled = first
    r = await api.post(f"/api/v1/flows/runs/{cancelled['run_id']}/cancel")
    assert r.status_code in (200, 202), r.text
    await api.wait(cancelled["run_id"])
    answer = await batch(
        api,
        [
            {"task_id": ok["task_id"], "attempt": 1, "output": {"id": "ch_ok"}},
            {"task_id": failing["task_id"], "attempt": 1, "retryable": False,
             "error": {"message": "card declined", "type": "Declined"}},
            {"task_id": big["task_id"], "attempt": 1,
             "output": "x" * (settings.max_step_output_bytes + 10)},
            {"task_id": cancelled["task_id"], "attempt": 1, "output": 1},
            {"task_id": "tsk_nope", "attempt": 1, "output": 1},
            {"task_id": ok["task_id"], "attempt": 2, "output": 1},
        ],
        max=5, wait_seconds=5,
    )  # fmt: skip
    said = [(a["status"], (a.get("error") or {}).get("code")) for a in answer["ends"]]
    assert said == [("completed", None), ("failed", None), ("refused", 400), ("refused", 409),
                    ("refused", 404), ("refused", 409)], answer  # fmt: skip
    assert "FLOWHOOK_MAX_STEP_OUTPUT_BYTES" in answer["ends"][2]["error"]["message"]
    [fifth] = answer["tasks"]  # claimed in the same request
    assert fifth["run_id"] not in {t["run_id"] for t in first} and fifth["attempt"] == 1
    outcome = {t["run_id"]: (await api.wait(t["run_id"]))["status"] for t in first}
    assert outcome[ok["run_id"]] == "completed"
    assert outcome[failing["run_id"]] == outcome[big["run_id"]] == "failed"
    assert outcome[cancelled["run_id"]] == "cancelled"
    again = await batch(api, [{"task_id": ok["task_id"], "attempt": 1, "output": {"id": "ch_ok"}}])
    assert again["ends"][0]["status"] == "completed" and again["tasks"] == []  # a repeat
    r = await api.post(
        f"/api/v1/tasks/{fifth['task_id']}/complete", {"attempt": 1, "output": {"id": "x"}}
    )
    assert r.status_code == 200, r.text
    ended = {run_id: (await api.wait(run_id))["status"] for run_id in runs}
    assert sorted(ended.values()) == ["cancelled", "completed", "completed", "failed", "failed"]


async def test_a_batch_waits_for_a_task_after_recording_its_ends(api: Api) -> None:
    flow = {"name": "two", "steps": [{"id": "a", "type": "task", "task": "payments.charge"},
                                     {"id": "b", "type": "task", "task": "payments.charge"}]}  # fmt: skip
    flow_id = await api.create_flow(flow)
    run_id = await api.execute(flow_id, {})
    [a] = await claim(api)
    answer = await batch(api, [{"task_id": a["task_id"], "attempt": 1, "output": 1}],
                         max=1, wait_seconds=10)  # fmt: skip
    [b] = answer["tasks"]  # the step its own end made ready
    assert (b["run_id"], b["step_id"]) == (run_id, "b")
    answer = await batch(api, [{"task_id": b["task_id"], "attempt": 1, "output": 2}])
    assert answer == {"ends": [{"task_id": b["task_id"], "status": "completed", "attempt": 1}],
                      "tasks": []}  # fmt: skip
    assert (await api.wait(run_id))["status"] == "completed"


async def test_bad_batches_answer_400_naming_the_field(api: Api) -> None:
    base = {"worker_id": "w1", "tasks": ["payments.charge"]}
    end = {"task_id": "tsk_x", "attempt": 1}
    for body, field in [
        ({**base, "ends": [end] * 101}, "ends"),
        ({**base, "max": 101}, "max"),
        ({**base, "ends": [{**end, "attempt": 0}]}, "ends.0.attempt"),
        ({**base, "ends": [{**end, "color": 1}]}, "ends.0.color"),
        ({**base, "ends": [{**end, "error": {"message": ""}}]}, "ends.0.error.message"),
        ({"tasks": ["payments.charge"]}, "worker_id"),
    ]:
        r = await api.post("/api/v1/tasks/batch", body)
        assert r.status_code == 400, (body, r.text)
        assert field in r.text, r.text


async def test_a_run_says_what_its_task_waits_for(api: Api) -> None:
    flow_id = await api.create_flow(task_flow())
    run_id = await api.execute(flow_id, {"amount": 1})
    async with asyncio.timeout(10):
        while ((why := (await run_of(api, run_id))["waiting_for"]) or {}).get("reason") != "task":
            await asyncio.sleep(0.02)
    assert why["reason"] == "task" and why["task"] == "payments.charge"
    assert why["step_id"] == "charge"
    assert why["no_worker"] is True and why["worker_id"] is None
    [task] = await claim(api)
    why = (await run_of(api, run_id))["waiting_for"]
    assert (why["worker_id"], why["attempt"], why["task_id"]) == ("w1", 1, task["task_id"])
    other = await api.create_flow({**task_flow(), "name": "another"})
    second = await api.execute(other, {"amount": 2})
    async with asyncio.timeout(10):
        while ((why := (await run_of(api, second))["waiting_for"]) or {}).get("reason") != "task":
            await asyncio.sleep(0.02)
    assert why["no_worker"] is False  # w1 runs payments.charge: it is busy, not missing


async def test_claims_are_scoped_to_the_workspace_and_mode(api: Api) -> None:
    flow_id = await api.create_flow(task_flow())
    run_id = await api.execute(flow_id, {"amount": 1})
    assert await claim(api, who="other", wait=0) == []
    assert await claim(api, who="live", wait=0) == []
    [task] = await claim(api)
    for who in ("other", "live"):
        r = await api.post(f"/api/v1/tasks/{task['task_id']}/complete",
                           {"attempt": 1, "output": 1}, who=who)  # fmt: skip
        assert r.status_code == 404, r.text
    assert (await run_of(api, run_id))["status"] == "running"


async def test_a_long_poll_is_answered_when_a_task_is_queued(api: Api) -> None:
    flow_id = await api.create_flow(task_flow())
    waiting = asyncio.create_task(claim(api, wait=30))
    await asyncio.sleep(0)  # the claim is waiting before the run is started
    await api.execute(flow_id, {"amount": 1})
    async with asyncio.timeout(10):
        [task] = await waiting
    assert task["attempt"] == 1


async def test_a_failed_attempt_is_retried_then_fails_the_step(api: Api) -> None:
    flow_id = await api.create_flow(task_flow(retry={"max_attempts": 2, "backoff_seconds": 0}))
    run_id = await api.execute(flow_id, {"amount": 1})
    [first] = await claim(api)
    r = await api.post(f"/api/v1/tasks/{first['task_id']}/fail",
                       {"attempt": 1, "error": {"message": "card declined", "type": "Declined"}})  # fmt: skip
    assert r.status_code == 200 and r.json()["status"] == "failed", r.text
    [second] = await claim(api, wait=10)
    assert second["task_id"] == first["task_id"] and second["attempt"] == 2
    late = await api.post(f"/api/v1/tasks/{first['task_id']}/heartbeat", {"attempt": 1})
    assert late.status_code == 409, late.text
    r = await api.post(f"/api/v1/tasks/{first['task_id']}/fail",
                       {"attempt": 2, "error": {"message": "card declined again"}})  # fmt: skip
    assert r.status_code == 200, r.text
    run = await api.wait(run_id)
    assert run["status"] == "failed", run
    assert run["error"]["type"] == "task" and run["error"]["message"] == "card declined again"
    [step] = [s for s in run["steps"] if s["id"] == "charge"]
    assert step["attempts"] == 2 and step["status"] == "failed"


async def test_a_non_retryable_failure_fails_the_step_at_once(api: Api) -> None:
    flow_id = await api.create_flow(task_flow(retry={"max_attempts": 5}))
    run_id = await api.execute(flow_id, {"amount": -1})
    [task] = await claim(api)
    r = await api.post(f"/api/v1/tasks/{task['task_id']}/fail",
                       {"attempt": 1, "error": {"message": "negative"}, "retryable": False})  # fmt: skip
    assert r.status_code == 200, r.text
    run = await api.wait(run_id)
    assert run["status"] == "failed" and run["error"]["message"] == "negative"


async def test_an_output_that_cannot_be_stored_fails_the_attempt_with_400(
    api: Api, settings: Settings
) -> None:
    flow_id = await api.create_flow(task_flow())
    run_id = await api.execute(flow_id, {"amount": 1})
    [task] = await claim(api)
    big = "x" * (settings.max_step_output_bytes + 10)
    r = await api.post(f"/api/v1/tasks/{task['task_id']}/complete", {"attempt": 1, "output": big})
    assert r.status_code == 400 and "FLOWHOOK_MAX_STEP_OUTPUT_BYTES" in r.json()["error"], r.text
    run = await api.wait(run_id)
    assert run["status"] == "failed" and run["error"]["type"] == "task", run
    assert "bytes" in run["error"]["message"]


async def test_cancel_tells_the_heartbeat_and_refuses_the_completion(api: Api) -> None:
    flow_id = await api.create_flow(task_flow())
    run_id = await api.execute(flow_id, {"amount": 1})
    [task] = await claim(api)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert r.status_code in (200, 202), r.text
    assert (await api.wait(run_id))["status"] == "cancelled"
    r = await api.post(f"/api/v1/tasks/{task['task_id']}/heartbeat", {"attempt": 1})
    assert r.status_code == 200 and r.json()["cancel_requested"] is True, r.text
    r = await api.post(f"/api/v1/tasks/{task['task_id']}/complete", {"attempt": 1, "output": 1})
    assert r.status_code == 409, r.text
    assert (await run_of(api, run_id))["status"] == "cancelled"


async def test_tasks_inside_map_and_parallel(api: Api) -> None:
    flow = {
        "name": "fan",
        "steps": [
            {"id": "each", "type": "map", "items": "{{ payload.skus }}", "steps": [
                {"id": "pick", "type": "task", "task": "payments.charge", "input": "{{ item }}"},
            ]},
            {"id": "both", "type": "parallel", "branches": {
                "a": [{"id": "ta", "type": "task", "task": "payments.charge", "input": "a"}],
                "b": [{"id": "tb", "type": "task", "task": "payments.charge", "input": "b"}],
            }},
        ],
        "output": {"items": "{{ steps.each.output }}", "both": "{{ steps.both.output }}"},
    }  # fmt: skip
    run_id = await api.execute(await api.create_flow(flow), {"skus": ["x", "y", "z"]})
    finished = 0
    async with asyncio.timeout(20):
        while finished < 5:
            for task in await claim(api, max=10):
                assert task["run_id"] == run_id  # the run people see, not the part
                r = await api.post(f"/api/v1/tasks/{task['task_id']}/complete",
                                   {"attempt": task["attempt"], "output": task["input"].upper()})  # fmt: skip
                assert r.status_code == 200, r.text
                finished += 1
    run = await api.wait(run_id)
    assert run["status"] == "completed", run
    assert run["output"] == {"items": ["X", "Y", "Z"], "both": {"a": "A", "b": "B"}}


async def test_bad_claims_answer_400_naming_the_field(api: Api) -> None:
    cases = [
        ({"worker_id": "w 1", "tasks": ["a"]}, "worker_id"),
        ({"worker_id": "w", "tasks": []}, "tasks"),
        ({"worker_id": "w", "tasks": ["a b"]}, "tasks"),
        ({"worker_id": "w", "tasks": ["a"], "max": 0}, "max"),
        ({"worker_id": "w", "tasks": ["a"], "wait_seconds": 61}, "wait_seconds"),
    ]
    for body, field in cases:
        r = await api.post("/api/v1/tasks/claim", body)
        assert r.status_code == 400 and field in r.text, (body, r.text)
    r = await api.post("/api/v1/tasks/tsk_nope/complete", {"attempt": 1, "output": 1})
    assert r.status_code == 404, r.text


# -- time: leases and attempt timeouts on a fake clock -------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
async def clocked(settings: Settings, clock: FakeClock) -> AsyncIterator[Api]:
    async with open_api(settings, clock) as opened:
        yield opened


async def test_a_lease_that_runs_out_is_taken_again_as_the_next_attempt(
    clocked: Api, clock: FakeClock
) -> None:
    api = clocked
    flow_id = await api.create_flow(task_flow(heartbeat_seconds=10))
    run_id = await api.execute(flow_id, {"amount": 1})
    [first] = await claim(api)
    assert await claim(api, worker_id="w2", wait=0) == []  # held
    clock.advance(11)  # w1 stopped heartbeating
    [again] = await claim(api, worker_id="w2", wait=0)
    assert again["task_id"] == first["task_id"] and again["attempt"] == 2
    r = await api.post(f"/api/v1/tasks/{first['task_id']}/complete", {"attempt": 1, "output": 1})
    assert r.status_code == 409, r.text  # attempt 1 no longer holds it
    r = await api.post(f"/api/v1/tasks/{first['task_id']}/complete",
                       {"attempt": 2, "output": {"id": "ch_2"}})  # fmt: skip
    assert r.status_code == 200, r.text
    run = await api.wait(run_id)
    [step] = [s for s in run["steps"] if s["id"] == "charge"]
    assert step["attempts"] == 2 and step["interrupted_attempts"] == [1], step


async def test_an_attempt_past_its_timeout_fails_and_is_retried(
    clocked: Api, clock: FakeClock
) -> None:
    api = clocked
    flow_id = await api.create_flow(
        task_flow(timeout_seconds=5, heartbeat_seconds=60, retry={"max_attempts": 2,
                                                                  "backoff_seconds": 0})
    )  # fmt: skip
    run_id = await api.execute(flow_id, {"amount": 1})
    [first] = await claim(api)
    clock.advance(6)
    api.app.state.services.wakeup.notify()  # the run wakes at the attempt's deadline
    [second] = await claim(api, wait=10)
    assert second["attempt"] == 2
    r = await api.post(f"/api/v1/tasks/{first['task_id']}/complete", {"attempt": 1, "output": 1})
    assert r.status_code == 409, r.text
    clock.advance(6)
    api.app.state.services.wakeup.notify()
    run = await api.wait(run_id)
    assert run["status"] == "failed" and run["error"]["type"] == "timeout", run


# -- the SDK's worker ------------------------------------------------------------------------


async def test_the_sdk_worker_runs_async_and_plain_functions(api: Api) -> None:
    flow = {
        "name": "two",
        "steps": [
            {"id": "a", "type": "task", "task": "double", "input": "{{ payload.n }}"},
            {"id": "b", "type": "task", "task": "label", "input": "{{ steps.a.output }}",
             "retry": {"max_attempts": 2, "backoff_seconds": 0}},
            {"id": "c", "type": "task", "task": "refuse"},
        ],
    }  # fmt: skip
    run_id = await api.execute(await api.create_flow(flow), {"n": 21})
    worker = Worker("http://flowhook.test", api.keys["test"], concurrency=4, claim_wait=1,
                    transport=httpx.ASGITransport(app=api.app))  # fmt: skip
    seen: list[TaskContext] = []

    @worker.task("double")
    async def double(value: int, ctx: TaskContext) -> int:
        seen.append(ctx)
        return value * 2

    @worker.task("label")
    def label(value: int, ctx: TaskContext) -> str:  # a plain function: run in a thread
        if ctx.attempt == 1:
            raise RuntimeError("flaky")
        return f"n={value}"

    @worker.task("refuse")
    def refuse(value: Any, ctx: TaskContext) -> None:
        raise NonRetryableError("no")

    serving = asyncio.create_task(worker.serve(handle_signals=False))
    run = await api.wait(run_id, timeout=20)
    worker.stop()
    async with asyncio.timeout(10):
        await serving
    assert run["status"] == "failed" and run["error"]["message"] == "no", run
    steps = {s["id"]: s for s in run["steps"]}
    assert steps["a"]["output"] == 42 and steps["b"]["output"] == "n=42"
    assert steps["b"]["attempts"] == 2
    assert seen[0].run_id == run_id and seen[0].step_id == "a" and seen[0].attempt == 1


async def test_retention_prunes_a_run_s_tasks_and_old_workers(api: Api) -> None:
    from sqlalchemy import func, select

    from flowhook.store.tables import tasks, workers

    flow_id = await api.create_flow(task_flow())
    run_id = await api.execute(flow_id, {"amount": 1})
    [task] = await claim(api)
    r = await api.post(
        f"/api/v1/tasks/{task['task_id']}/complete", {"attempt": 1, "output": {"id": "x"}}
    )
    assert r.status_code == 200, r.text
    assert (await api.wait(run_id))["status"] == "completed"
    services = api.app.state.services
    assert await services.retention.prune(days=0) == 1
    await services.retention.prune_all(days=0)
    async with services.db.read() as conn:
        assert (await conn.execute(select(func.count()).select_from(tasks))).scalar() == 0
        assert (await conn.execute(select(func.count()).select_from(workers))).scalar() == 0
