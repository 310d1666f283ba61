"""``parallel`` and ``map`` steps on both backends: outputs and their shapes, nested steps in
the run record and events with ``parent``/``branch``/``index``, a failed branch or item, a map
over a non-list or too many items, ``concurrency``, retries inside an item, nesting (a map of
parallels, a parallel holding a sub-flow), cancel."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from tests.conftest import Api, Receiver


def enrich_flow() -> dict[str, Any]:
    return {
        "name": "enrich",
        "steps": [
            {"id": "start", "type": "transform", "output": {"customer": "{{ payload.customer }}"}},
            {
                "id": "enrich",
                "type": "parallel",
                "branches": {
                    "crm": [
                        {"id": "crm_look", "type": "transform",
                         "output": {"tier": "gold", "who": "{{ steps.start.output.customer }}"}},
                    ],
                    "billing": [
                        {"id": "bill_look", "type": "transform", "output": {"owed": 12}},
                        {"id": "bill_sum", "type": "transform",
                         "output": {"owed": "{{ steps.bill_look.output.owed * 2 }}"}},
                    ],
                },
            },
            {"id": "after", "type": "transform",
             "output": {"tier": "{{ steps.enrich.output.crm.tier }}",
                        "owed": "{{ steps.enrich.output.billing.owed }}"}},
        ],
        "output": {"result": "{{ steps.after.output }}"},
    }  # fmt: skip


def each_flow(**extra: Any) -> dict[str, Any]:
    return {
        "name": "charge each line",
        "steps": [
            {
                "id": "each",
                "type": "map",
                "items": "{{ payload.lines }}",
                "steps": [
                    {"id": "charge", "type": "transform",
                     "output": {"sku": "{{ item.sku }}", "cents": "{{ item.qty * 250 }}",
                                "at": "{{ index }}"}},
                ],
                **extra,
            },
            {"id": "notify", "type": "transform",
             "output": {"total": "{{ steps.each.output | sum(attribute='cents') }}"}},
        ],
        "output": {"total": "{{ steps.notify.output.total }}"},
    }  # fmt: skip


async def test_parallel_branches_give_an_output_by_name_and_nested_records(api: Api) -> None:
    flow_id = await api.create_flow(enrich_flow())
    run_id = await api.execute(flow_id, {"customer": "cus_42"})
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    assert done["output"] == {"result": {"tier": "gold", "owed": 24}}
    ids = [(s["id"], s.get("parent"), s.get("branch")) for s in done["steps"]]
    assert ids[0] == ("start", None, None) and ids[1] == ("enrich", None, None)
    nested = ids[2:5]
    assert sorted(nested) == sorted(
        [("crm_look", "enrich", "crm"), ("bill_look", "enrich", "billing"),
         ("bill_sum", "enrich", "billing")]
    )  # fmt: skip
    assert nested.index(("bill_look", "enrich", "billing")) < nested.index(
        ("bill_sum", "enrich", "billing")
    )
    assert ids[5] == ("after", None, None)
    assert done["steps"][1]["output"] == {"crm": {"tier": "gold", "who": "cus_42"},
                                          "billing": {"owed": 24}}  # fmt: skip
    assert done["steps_executed"] == 3 + 3
    events = (await api.get(f"/api/v1/flows/runs/{run_id}/events")).json()["data"]
    nested_events = [e["body"]["payload"] for e in events if e["body"]["payload"].get("parent")]
    assert {(p["step_id"], p["branch"]) for p in nested_events} == {
        ("crm_look", "crm"), ("bill_look", "billing"), ("bill_sum", "billing")
    }  # fmt: skip
    assert all(e["body"]["run_id"] == run_id for e in events)
    listed = (await api.get("/api/v1/flows/runs", params={"flow_id": flow_id})).json()["data"]
    assert [r["run_id"] for r in listed] == [run_id]  # parts are not runs of their own


async def test_map_output_is_in_item_order_and_items_see_item_and_index(api: Api) -> None:
    flow_id = await api.create_flow(each_flow(concurrency=2))
    lines = [{"sku": f"s{i}", "qty": i + 1} for i in range(7)]
    done = await api.wait(await api.execute(flow_id, {"lines": lines}))
    assert done["status"] == "completed", done
    each = done["steps"][0]
    assert [o["sku"] for o in each["output"]] == [f"s{i}" for i in range(7)]
    assert [o["at"] for o in each["output"]] == list(range(7))
    assert done["output"] == {"total": sum((i + 1) * 250 for i in range(7))}
    nested = [s for s in done["steps"] if s.get("parent") == "each"]
    assert [s["index"] for s in nested] == list(range(7))
    assert done["steps_executed"] == 2 + 7


async def test_a_map_over_an_empty_list_gives_an_empty_list(api: Api) -> None:
    flow_id = await api.create_flow(each_flow())
    done = await api.wait(await api.execute(flow_id, {"lines": []}))
    assert done["status"] == "completed" and done["steps"][0]["output"] == [], done


async def test_a_map_over_a_non_list_or_too_many_items_fails_clearly(api: Api) -> None:
    flow_id = await api.create_flow(each_flow())
    done = await api.wait(await api.execute(flow_id, {"lines": {"a": 1}}))
    assert done["status"] == "failed" and done["error"]["type"] == "map_items", done
    assert done["error"]["message"] == "items must be a list, not dict"
    done = await api.wait(await api.execute(flow_id, {"lines": [{"sku": 1, "qty": 1}] * 1001}))
    assert done["error"]["type"] == "map_items", done
    assert "1001 items, more than 1000 (FLOWHOOK_MAX_MAP_ITEMS)" in done["error"]["message"]


async def parts_when_ended(api: Api, run_id: str) -> dict[Any, dict[str, Any]]:
    """The run's parts once every one has ended, by branch name or item index, with their
    status and step records."""
    from sqlalchemy import select

    from flowhook.store import runs as runs_store
    from flowhook.store.tables import runs

    db = api.app.state.services.db
    async with asyncio.timeout(10):
        while True:
            async with db.read() as conn:
                q = select(runs.c.run_id).where(runs.c.root_run_id == run_id)
                ids = (await conn.execute(q)).scalars().all()
                parts = [await runs_store.get_run_by_id(conn, i) for i in ids]
            if all(p is not None and p.status.terminal for p in parts):
                break
            await asyncio.sleep(0.05)
    found: dict[Any, dict[str, Any]] = {}
    for part in parts:
        assert part is not None
        scope = part.scope or {}
        steps = {s.step_id: s for s in part.steps}
        found[scope.get("branch", scope.get("index"))] = {"status": str(part.status), **steps}
    return found


async def test_a_failed_item_fails_the_step_and_stops_the_others(api: Api) -> None:
    flow = {
        "name": "one bad line",
        "steps": [
            {
                "id": "each",
                "type": "map",
                "items": "{{ payload.lines }}",
                "concurrency": 3,
                "steps": [
                    {"id": "check", "type": "condition", "if": "{{ item > 0 }}", "else": "fail"},
                    {"id": "hold", "type": "wait", "signal": "line.{{ index }}"},
                ],
            }
        ],
    }
    flow_id = await api.create_flow(flow)
    run_id = await api.execute(flow_id, {"lines": [1, 2, -3, 4, 5]})
    done = await api.wait(run_id)
    assert done["status"] == "failed", done
    assert done["error"]["type"] == "item_failed" and done["error"]["index"] == 2
    assert done["error"]["step"] == "each"
    items = {s["index"]: s for s in done["steps"] if s.get("parent") == "each"}
    assert 3 not in items and 4 not in items  # held back, never started
    assert items[2]["status"] == "failed"
    # no item completes (each waits for a signal no one sends): every other item is stopped,
    # the two beside it wherever they were, the two held back before they started
    parts = await parts_when_ended(api, run_id)
    assert {i: p["status"] for i, p in parts.items()} == {
        0: "cancelled", 1: "cancelled", 2: "failed", 3: "cancelled", 4: "cancelled"
    }  # fmt: skip
    assert set(parts[3]) == set(parts[4]) == {"status"}  # no step ran


async def test_a_failed_branch_fails_the_step(api: Api) -> None:
    flow = {
        "name": "one bad branch",
        "steps": [
            {
                "id": "both",
                "type": "parallel",
                "branches": {
                    "slow": [{"id": "nap", "type": "python", "function": "nap", "input": 3},
                             {"id": "hold", "type": "wait", "signal": "never"}],
                    "idle": [{"id": "idle", "type": "wait", "signal": "never"}],
                    "quick": [{"id": "fine", "type": "transform", "output": {"ok": True}}],
                    "bad": [{"id": "go", "type": "wait", "signal": "go",
                             "match": {"run": "{{ run.id }}"}},
                            {"id": "boom", "type": "fail", "message": "CRM is down"}],
                },
            }
        ],
    }  # fmt: skip
    run_id = await api.execute(await api.create_flow(flow))
    want = {"nap": "running", "idle": "waiting", "fine": "completed", "go": "waiting"}
    async with asyncio.timeout(10):  # every branch is where the test wants it
        while True:
            run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
            if want.items() <= {(s["id"], s["status"]) for s in run["steps"]}:
                break
            await asyncio.sleep(0.02)
    r = await api.post("/api/v1/signals", {"name": "go", "data": {"run": run_id}})
    assert r.status_code == 202 and r.json()["matched"] == 1, r.text
    done = await api.wait(run_id)
    assert done["status"] == "failed", done
    assert done["error"]["type"] == "branch_failed" and done["error"]["branch"] == "bad"
    assert "CRM is down" in done["error"]["message"]
    parts = await parts_when_ended(api, run_id)
    statuses = {name: p["status"] for name, p in parts.items()}
    assert statuses == {"slow": "cancelled", "idle": "cancelled", "quick": "completed",
                        "bad": "failed"}  # fmt: skip
    # the branch in a step stops at the end of it: its step is not cut short, the next one
    # never starts
    nap = parts["slow"]["nap"]
    assert (str(nap.status), nap.output, nap.interrupted) == ("completed", {"slept": 3}, ())
    assert "hold" not in parts["slow"]


async def test_retries_inside_an_item_and_a_map_of_parallels(api: Api) -> None:
    flow = {
        "name": "nested",
        "steps": [
            {
                "id": "each",
                "type": "map",
                "items": [1, 2, 3],
                "steps": [
                    {
                        "id": "both",
                        "type": "parallel",
                        "branches": {
                            "a": [{"id": "double", "type": "transform",
                                   "output": {"v": "{{ item * 2 }}"}}],
                            "b": [{"id": "square", "type": "transform",
                                   "output": {"v": "{{ item * item }}"}}],
                        },
                    },
                    {"id": "sum", "type": "transform",
                     "output": {"v": "{{ steps.both.output.a.v + steps.both.output.b.v }}"}},
                ],
            }
        ],
        "output": {"sums": "{{ steps.each.output | map(attribute='v') | list }}"},
    }  # fmt: skip
    done = await api.wait(await api.execute(await api.create_flow(flow)))
    assert done["status"] == "completed", done
    assert done["output"] == {"sums": [3, 8, 15]}
    inner = [s for s in done["steps"] if s.get("parent") == "both"]
    assert sorted((s["id"], s["branch"]) for s in inner) == sorted(
        [("double", "a"), ("square", "b")] * 3
    )
    assert done["steps_executed"] == 1 + 3 * (1 + 2 + 1)


async def test_cancelling_a_run_stops_its_branches_and_items(api: Api) -> None:
    flow = {
        "name": "waits in parts",
        "steps": [
            {
                "id": "each",
                "type": "map",
                "items": [1, 2, 3],
                "steps": [{"id": "hold", "type": "wait", "signal": "never"}],
            }
        ],
    }
    run_id = await api.execute(await api.create_flow(flow))
    async with asyncio.timeout(10):
        while True:
            run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
            if len([s for s in run["steps"] if s.get("parent") == "each"]) == 3:
                break
            await asyncio.sleep(0.05)
    assert (await api.post(f"/api/v1/flows/runs/{run_id}/cancel")).status_code in (200, 202)
    done = await api.wait(run_id)
    assert done["status"] == "cancelled"
    db = api.app.state.services.db
    from sqlalchemy import select

    from flowhook.store.tables import runs

    async with db.read() as conn:
        statuses = (
            (await conn.execute(select(runs.c.status).where(runs.c.root_run_id == run_id)))
            .scalars()
            .all()
        )
    assert sorted(statuses) == ["cancelled"] * 3


async def test_a_parallel_branch_can_call_a_sub_flow(api: Api) -> None:
    child = await api.create_flow(
        {"name": "child", "steps": [{"id": "c", "type": "transform", "output": {"n": 1}}],
         "output": {"n": "{{ steps.c.output.n }}"}}
    )  # fmt: skip
    flow = {
        "name": "calls",
        "steps": [
            {
                "id": "both",
                "type": "parallel",
                "branches": {
                    "sub": [{"id": "call", "type": "flow", "flow_id": child}],
                    "local": [{"id": "here", "type": "transform", "output": {"n": 2}}],
                },
            }
        ],
    }
    run_id = await api.execute(await api.create_flow(flow))
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    assert done["steps"][0]["output"] == {"sub": {"n": 1}, "local": {"n": 2}}
    [child_run] = (await api.get("/api/v1/flows/runs", params={"flow_id": child})).json()["data"]
    assert child_run["parent_run_id"] == run_id  # the run, not the branch's part


async def test_later_steps_and_map_items_reach_the_steps_of_a_parallel_s_branches(
    api: Api,
) -> None:
    flow = {
        "name": "reach",
        "steps": [
            {"id": "enrich", "type": "parallel", "branches": {
                "crm": [{"id": "crm_lookup", "type": "transform", "output": {"tier": "gold"}}],
                "billing": [{"id": "terms", "type": "transform", "output": {"days": 30}}]}},
            {"id": "each", "type": "map", "items": [1, 2],
             "steps": [{"id": "price", "type": "transform",
                        "output": {"tier": "{{ steps.crm_lookup.output.tier }}", "n": "{{ item }}"}}]},
            {"id": "after", "type": "transform", "output": {"days": "{{ steps.terms.output.days }}"}},
        ],
        "output": {"days": "{{ steps.after.output.days }}",
                   "tiers": "{{ steps.each.output | map(attribute='tier') | list }}"},
    }  # fmt: skip
    done = await api.wait(await api.execute(await api.create_flow(flow)))
    assert done["status"] == "completed", done
    assert done["output"] == {"days": 30, "tiers": ["gold", "gold"]}


async def test_a_flaky_step_inside_an_item_is_retried_there(api: Api) -> None:
    flow = {
        "name": "retry inside",
        "steps": [
            {"id": "each", "type": "map", "items": [1, 2],
             "steps": [{"id": "shaky", "type": "python", "function": "flaky",
                        "retry": {"max_attempts": 3, "backoff_seconds": 0}}]},
        ],
    }  # fmt: skip
    done = await api.wait(await api.execute(await api.create_flow(flow)))
    assert done["status"] == "completed", done
    shaky = [s for s in done["steps"] if s["id"] == "shaky"]
    assert [(s["index"], s["attempts"], s["status"]) for s in shaky] == [
        (0, 3, "completed"),
        (1, 3, "completed"),
    ]


async def test_a_map_step_s_timeout_stops_its_items(api: Api) -> None:
    flow = {
        "name": "slow items",
        "steps": [
            {"id": "each", "type": "map", "items": [1, 2], "timeout_seconds": 0.5,
             "steps": [{"id": "hold", "type": "wait", "signal": "never"}]},
        ],
    }  # fmt: skip
    run_id = await api.execute(await api.create_flow(flow))
    done = await api.wait(run_id)
    assert done["status"] == "failed" and done["error"]["type"] == "timeout", done
    assert done["error"]["step"] == "each"
    db = api.app.state.services.db
    from sqlalchemy import select

    from flowhook.store.tables import runs

    async with asyncio.timeout(10):
        while True:
            async with db.read() as conn:
                q = select(runs.c.status).where(runs.c.root_run_id == run_id)
                statuses = (await conn.execute(q)).scalars().all()
            if sorted(statuses) == ["cancelled", "cancelled"]:
                break
            await asyncio.sleep(0.05)


async def test_rerun_treats_a_map_as_one_unit(api: Api) -> None:
    flow = {
        "name": "rerun a map",
        "steps": [
            {"id": "each", "type": "map", "items": [1, 2],
             "steps": [{"id": "twice", "type": "transform", "output": {"v": "{{ item * 2 }}"}}]},
            {"id": "gate", "type": "condition", "if": "{{ payload.ok }}", "else": "fail"},
        ],
        "output": {"vs": "{{ steps.each.output | map(attribute='v') | list }}"},
    }  # fmt: skip
    flow_id = await api.create_flow(flow)
    failed = await api.wait(await api.execute(flow_id, {"ok": False}))
    assert failed["status"] == "failed" and failed["error"]["step"] == "gate"
    run_id = failed["run_id"]
    r = await api.post(f"/api/v1/flows/runs/{run_id}/rerun", {"payload": {"ok": True}})
    assert r.status_code == 202, r.text
    again = await api.wait(r.json()["run_id"])
    assert again["status"] == "completed" and again["output"] == {"vs": [2, 4]}, again
    assert again["steps"][0]["reused"] is True  # the map's output is reused whole
    assert not [s for s in again["steps"] if s.get("parent")]
    r = await api.post(
        f"/api/v1/flows/runs/{run_id}/rerun", {"from_step": "each", "payload": {"ok": True}}
    )
    whole = await api.wait(r.json()["run_id"])
    assert whole["status"] == "completed" and whole["steps"][0]["reused"] is False
    assert [s["index"] for s in whole["steps"] if s.get("parent") == "each"] == [0, 1]


async def test_a_rerun_after_a_parallel_reaches_the_steps_of_its_branches(api: Api) -> None:
    flow = {
        "name": "rerun after a parallel",
        "steps": [
            {"id": "enrich", "type": "parallel", "branches": {
                "crm": [{"id": "crm_lookup", "type": "transform",
                         "output": {"tier": "{{ payload.tier }}"}}],
                "billing": [{"id": "terms", "type": "transform", "output": {"days": 30}}]}},
            {"id": "gate", "type": "condition", "if": "{{ payload.ok }}", "else": "fail"},
            {"id": "each", "type": "map", "items": [1, 2],
             "steps": [{"id": "price", "type": "transform",
                        "output": {"tier": "{{ steps.crm_lookup.output.tier }}"}}]},
            {"id": "charge", "type": "transform",
             "output": {"tier": "{{ steps.crm_lookup.output.tier }}",
                        "days": "{{ steps.terms.output.days }}"}},
        ],
        "output": {"charge": "{{ steps.charge.output }}",
                   "tiers": "{{ steps.each.output | map(attribute='tier') | list }}"},
    }  # fmt: skip
    flow_id = await api.create_flow(flow)
    failed = await api.wait(await api.execute(flow_id, {"tier": "gold", "ok": False}))
    assert failed["status"] == "failed" and failed["error"]["step"] == "gate", failed
    r = await api.post(
        f"/api/v1/flows/runs/{failed['run_id']}/rerun", {"payload": {"tier": "blue", "ok": True}}
    )
    assert r.status_code == 202, r.text
    again = await api.wait(r.json()["run_id"])
    assert again["status"] == "completed", again
    assert again["steps"][0]["reused"] is True
    # the branches ran in the original run, with its payload: the rerun sees their results
    expected = {"charge": {"tier": "gold", "days": 30}, "tiers": ["gold", "gold"]}
    assert again["output"] == expected
    # a rerun of the rerun reuses the parallel again: found two runs back
    r = await api.post(f"/api/v1/flows/runs/{again['run_id']}/rerun", {"from_step": "charge"})
    third = await api.wait(r.json()["run_id"])
    assert third["status"] == "completed" and third["output"]["charge"] == expected["charge"]
    assert [s["reused"] for s in third["steps"]] == [True, True, True, False]


async def nested_waiting(api: Api, run_id: str, step_id: str, count: int) -> None:
    """Once ``count`` of the run's nested steps ``step_id`` wait."""
    async with asyncio.timeout(10):
        while True:
            run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
            found = [s for s in run["steps"] if (s["id"], s["status"]) == (step_id, "waiting")]
            if len(found) == count:
                return
            await asyncio.sleep(0.02)


async def test_a_branch_s_wait_and_approval_are_reached_through_the_run_s_id(api: Api) -> None:
    flow = {
        "name": "nested wait and approval",
        "steps": [{"id": "both", "type": "parallel", "branches": {
            "paid": [{"id": "paid", "type": "wait", "signal": "order.paid"}],
            "ok": [{"id": "manager", "type": "approval", "message": "Ship it?"}]}}],
        "output": {"got": "{{ steps.both.output }}"},
    }  # fmt: skip
    run_id = await api.execute(await api.create_flow(flow))
    await nested_waiting(api, run_id, "paid", 1)
    await nested_waiting(api, run_id, "manager", 1)
    r = await api.post(
        f"/api/v1/flows/runs/{run_id}/signal", {"name": "order.paid", "data": {"n": 1}}
    )
    assert r.status_code == 202 and r.json()["matched"] == 1, r.text
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/approve", {"comment": "go"})
    assert r.status_code == 200 and r.json()["approved"] is True, r.text
    assert r.json()["run_id"] == run_id  # the run people know, not its branch's part
    again = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/reject")
    assert again.status_code == 409 and again.json()["code"] in ("already_decided", "run_finished")
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    got = done["output"]["got"]
    assert got["paid"]["data"] == {"n": 1} and got["ok"]["comment"] == "go"


async def test_a_signal_to_the_run_resumes_each_item_s_wait_and_an_item_s_approval_is_ambiguous(
    api: Api,
) -> None:
    flow = {
        "name": "nested in a map",
        "steps": [{"id": "each", "type": "map", "items": [1, 2],
                   "steps": [{"id": "paid", "type": "wait", "signal": "order.paid"},
                             {"id": "manager", "type": "approval", "message": "Item {{ item }}?"}]}],
    }  # fmt: skip
    run_id = await api.execute(await api.create_flow(flow))
    await nested_waiting(api, run_id, "paid", 2)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/signal", {"name": "order.paid"})
    assert r.status_code == 202 and r.json()["matched"] == 2, r.text  # one wait per item
    await nested_waiting(api, run_id, "manager", 2)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/approve")
    assert r.status_code == 409 and r.json()["code"] == "ambiguous_step", r.text
    assert "2 items" in r.json()["error"]
    assert (await api.post(f"/api/v1/flows/runs/{run_id}/cancel")).status_code in (200, 202)


async def test_steps_of_a_parallel_inside_a_branch_are_reached_after_the_outer_one(
    api: Api,
) -> None:
    """`steps.<id>` reaches any finished step: those of a parallel nested in a branch too."""
    flow = {
        "name": "deep",
        "steps": [
            {
                "id": "outer",
                "type": "parallel",
                "branches": {
                    "a": [
                        {
                            "id": "inner",
                            "type": "parallel",
                            "branches": {
                                "x": [{"id": "x1", "type": "transform", "output": {"v": 1}}],
                                "y": [{"id": "y1", "type": "transform", "output": {"v": 2}}],
                            },
                        },
                        {
                            "id": "a2",
                            "type": "transform",
                            "output": {"s": "{{ steps.inner.output.x.v + steps.x1.output.v }}"},
                        },
                    ],
                    "b": [{"id": "b1", "type": "transform", "output": {"v": 3}}],
                },
            },
            {
                "id": "after",
                "type": "transform",
                "output": {
                    "i": "{{ steps.inner.output.y.v }}",
                    "x": "{{ steps.x1.output.v }}",
                    "a2": "{{ steps.a2.output.s }}",
                    "b": "{{ steps.b1.output.v }}",
                },
            },
        ],
        "output": {"r": "{{ steps.after.output }}"},
    }
    flow_id = await api.create_flow(flow)
    run_id = await api.execute(flow_id, {})
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    assert done["output"] == {"r": {"i": 2, "x": 1, "a2": 2, "b": 3}}


async def test_cancelling_a_run_interrupts_a_nested_step_in_flight(api: Api) -> None:
    """A branch's python step sleeping a minute is cut short by the user's cancel: the run
    and both its branches end cancelled within seconds, not after the minute."""
    flow = {
        "name": "a long branch",
        "steps": [
            {"id": "both", "type": "parallel", "branches": {
                "slow": [{"id": "nap", "type": "python", "function": "nap", "input": 60}],
                "idle": [{"id": "hold", "type": "wait", "signal": "never"}]}},
        ],
    }  # fmt: skip
    run_id = await api.execute(await api.create_flow(flow))
    async with asyncio.timeout(10):
        while True:
            run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
            now = {s["id"]: s["status"] for s in run["steps"]}
            if now.get("nap") == "running" and now.get("hold") == "waiting":
                break
            await asyncio.sleep(0.05)
    assert (await api.post(f"/api/v1/flows/runs/{run_id}/cancel")).status_code in (200, 202)
    done = await api.wait(run_id, timeout=15)
    assert done["status"] == "cancelled", done
    db = api.app.state.services.db
    from sqlalchemy import select

    from flowhook.store.tables import runs

    async with asyncio.timeout(15):
        while True:
            async with db.read() as conn:
                q = select(runs.c.status).where(runs.c.root_run_id == run_id)
                statuses = (await conn.execute(q)).scalars().all()
            if sorted(statuses) == ["cancelled", "cancelled"]:
                break
            await asyncio.sleep(0.05)


async def test_each_item_branch_and_sub_flow_run_sends_its_own_idempotency_key(
    api: Api, receiver: Receiver
) -> None:
    """A receiver that deduplicates on the http step's Idempotency-Key (as the README tells
    it to) charges every line of a map once: each item, each branch and each sub-flow run
    has a key of its own, and each keeps it through its retries."""
    receiver.script = [(500, {})] * 3  # three first attempts fail; their retries succeed
    post = {"method": "POST", "url": receiver.url}
    retry = {"max_attempts": 3, "backoff_seconds": 0}
    child_id = await api.create_flow(
        {"name": "ship", "steps": [
            {"id": "charge", "type": "http", "request": {**post, "json": {"sku": "child"}}}]}
    )  # fmt: skip
    flow_id = await api.create_flow(
        {"name": "order", "steps": [
            {"id": "lines", "type": "map", "items": "{{ payload.skus }}", "steps": [
                {"id": "charge", "type": "http", "retry": retry,
                 "request": {**post, "json": {"sku": "{{ item }}"}}}]},
            {"id": "side", "type": "parallel", "branches": {
                "a": [{"id": "charge_a", "type": "http", "request": {**post, "json": {"sku": "a"}}}],
                "b": [{"id": "call", "type": "flow", "flow_id": child_id}]}},
            {"id": "total", "type": "http", "request": {**post, "json": {"sku": "total"}}},
        ]}
    )  # fmt: skip
    run_id = await api.execute(flow_id, {"skus": ["tea", "cup", "pot"]})
    run = await api.wait(run_id)
    assert run["status"] == "completed", run["error"]
    keys: dict[str, set[str]] = {}
    for r in receiver.requests:
        sku = orjson.loads(r["body"])["sku"]
        keys.setdefault(sku, set()).add(r["headers"]["Idempotency-Key"])
    assert len(receiver.requests) == 6 + 3  # three retried map items, then the other three
    assert all(len(k) == 1 for k in keys.values()), keys  # the same key on every attempt
    one = {sku: next(iter(k)) for sku, k in keys.items()}
    assert len(set(one.values())) == 6, one  # tea, cup, pot, a, child, total: six keys
    assert one["total"] == f"{run_id}:total"  # a step of the run itself: as before
    assert all(one[s].startswith(f"{run_id}:") for s in ("tea", "cup", "pot", "a")), one
