"""Flow control per key on both backends: per-key concurrency (a burst over many keys, runs
held with ``waiting_for``, a busy key never delaying another, slots freed by an end and by a
cancel, a raised limit), throttle, debounce, priority, and the 400s for keys that fail."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowhook.clock import FakeClock
from flowhook.config import Settings
from flowhook.ids import new_id
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, Run, RunStatus
from tests.conftest import Api, open_api
from tests.integration.test_signals import signal, waiting


def span_flow(nap: float = 0.01, **control: Any) -> dict[str, Any]:
    return {
        "name": "sync customer",
        "steps": [{"id": "sync", "type": "python", "function": "span", "input": nap}],
        **control,
    }


def gated_flow(**control: Any) -> dict[str, Any]:
    """Runs that wait for ``go`` with their payload's ``id``: they hold their slot meanwhile."""
    return {
        "name": "gated",
        "timeout_seconds": 600,
        "steps": [
            {"id": "gate", "type": "wait", "signal": "go", "match": {"id": "{{ payload.id }}"}},
            {"id": "done", "type": "transform", "output": {"id": "{{ payload.id }}"}},
        ],
        **control,
    }


def held_back(run: dict[str, Any]) -> bool:
    """Whether flow control holds the run back (a queued run not held waits for a worker)."""
    return (run["waiting_for"] or {}).get("reason") in ("concurrency", "throttle", "debounce")


async def execute_all(api: Api, flow_id: str, payloads: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for i in range(0, len(payloads), 50):
        ids += await asyncio.gather(*(api.execute(flow_id, p) for p in payloads[i : i + 50]))
    return ids


async def run_of(api: Api, run_id: str) -> dict[str, Any]:
    r = await api.get(f"/api/v1/flows/runs/{run_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def until(api: Api, run_id: str, check: Any, timeout: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            run = await run_of(api, run_id)
            if check(run):
                return run
            await asyncio.sleep(0.02)


def peak_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment (an end at the moment of a start is not overlap)."""
    moments = sorted([(e, -1) for _, e in spans] + [(b, 1) for b, _ in spans])
    now = peak = 0
    for _, step in moments:
        now += step
        peak = max(peak, now)
    return peak


async def test_a_burst_over_50_keys_never_runs_more_than_2_per_key(api: Api) -> None:
    flow_id = await api.create_flow(
        span_flow(0.01, concurrency={"limit": 2, "key": "{{ payload.k }}"})
    )
    payloads = [{"k": f"cus_{i % 50}"} for i in range(1000)]
    ids = await execute_all(api, flow_id, payloads)
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run_id in ids:
        run = await api.wait(run_id, timeout=120)
        assert run["status"] == "completed", run
        out = run["steps"][0]["output"]
        by_key[out["k"]].append((out["begun"], out["ended"]))
    assert len(by_key) == 50 and sum(len(s) for s in by_key.values()) == 1000
    peaks = {k: peak_overlap(spans) for k, spans in by_key.items()}
    assert max(peaks.values()) <= 2, peaks


async def test_a_held_run_says_why_and_a_busy_key_never_delays_another(api: Api) -> None:
    flow_id = await api.create_flow(gated_flow(concurrency={"limit": 1, "key": "{{ payload.k }}"}))
    first = await api.execute(flow_id, {"k": "cus_42", "id": 1})
    await waiting(api, first, "gate")
    second = await api.execute(flow_id, {"k": "cus_42", "id": 2})
    held = await until(api, second, held_back)
    assert held["status"] == "queued"
    assert held["waiting_for"] == {
        "reason": "concurrency", "key": "cus_42", "until": None, "held_by": [first]
    }  # fmt: skip
    other = await api.execute(flow_id, {"k": "cus_7", "id": 3})  # another key goes at once
    await waiting(api, other, "gate")
    assert (await run_of(api, second))["status"] == "queued"
    await signal(api, "go", {"id": 1})  # the first ends: the second takes its slot
    assert (await api.wait(first))["status"] == "completed"
    started = await waiting(api, second, "gate")
    assert started["waiting_for"]["reason"] == "signal"  # asleep in its own step now
    assert started["waiting_for"]["step_id"] == "gate"
    await signal(api, "go", {"id": 2})
    await signal(api, "go", {"id": 3})
    assert (await api.wait(second))["status"] == "completed"
    assert (await api.wait(other))["status"] == "completed"


async def test_cancelling_the_run_holding_the_slot_lets_the_next_go(api: Api) -> None:
    flow_id = await api.create_flow(gated_flow(concurrency=1))
    first = await api.execute(flow_id, {"id": "a"})
    await waiting(api, first, "gate")
    second, third = await api.execute(flow_id, {"id": "b"}), await api.execute(flow_id, {"id": "c"})
    held = await until(api, third, held_back)
    assert held["waiting_for"]["key"] is None  # one cap for the whole flow
    r = await api.post(f"/api/v1/flows/runs/{third}/cancel")  # a held run cancels at once
    assert r.status_code in (200, 202), r.text
    assert (await api.wait(third))["status"] == "cancelled"
    r = await api.post(f"/api/v1/flows/runs/{first}/cancel")
    assert r.status_code in (200, 202), r.text
    assert (await api.wait(first))["status"] == "cancelled"
    await waiting(api, second, "gate")  # the slot went to the next held run
    await signal(api, "go", {"id": "b"})
    done = await api.wait(second)
    assert done["status"] == "completed", (done["error"], done["steps"])


async def test_raising_the_limit_lets_held_runs_go(api: Api) -> None:
    definition = gated_flow(concurrency={"limit": 1, "key": "{{ payload.tenant }}"})
    flow_id = await api.create_flow(definition)
    ids = [await api.execute(flow_id, {"id": f"r{i}", "tenant": "t1"}) for i in range(3)]
    await waiting(api, ids[0], "gate")
    for run_id in ids[1:]:
        await until(api, run_id, held_back)
    definition["concurrency"]["limit"] = 3
    r = await api.client.put(f"/api/v1/flows/{flow_id}", json=definition, headers=api.auth())
    assert r.status_code == 200, r.text
    await asyncio.sleep(1.1)  # workers read a flow's latest limit at most once a second
    newer = await api.execute(flow_id, {"id": "r3", "tenant": "t1"})  # admitted on v2's limit
    await waiting(api, newer, "gate")
    # the newer run's admission saw room for one more: the oldest held run took it
    await waiting(api, ids[1], "gate")
    assert held_back(await run_of(api, ids[2]))  # three are running
    await signal(api, "go", {"id": "r0"})
    await waiting(api, ids[2], "gate")
    for i in range(1, 4):
        await signal(api, "go", {"id": f"r{i}"})
    for run_id in [*ids, newer]:
        assert (await api.wait(run_id))["status"] == "completed"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
async def clocked(settings: Settings, clock: FakeClock) -> AsyncIterator[Api]:
    """The app with its engine on ``clock``: a throttle's reserved starts come when the test
    moves the clock, not when a loaded machine gets round to them."""
    async with open_api(settings, clock) as opened:
        yield opened


async def advance(api: Api, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    api.app.state.services.wakeup.notify()  # the engine claims what fell due, at once


def started_at(run: dict[str, Any]) -> float:
    return datetime.fromisoformat(run["started_at"]).timestamp()


async def settle(api: Api, ids: list[str], completed: int, held: int) -> list[dict[str, Any]]:
    """The runs once ``completed`` of them have completed and ``held`` more wait for their
    throttled start (the rest, if any, wait for a concurrency slot): nothing else happens
    until the clock moves."""
    async with asyncio.timeout(10):
        while True:
            runs = [await run_of(api, run_id) for run_id in ids]
            done = [r for r in runs if r["status"] == "completed"]
            throttled = [r for r in runs if (r["waiting_for"] or {}).get("reason") == "throttle"]
            if len(done) == completed and len(throttled) == held:
                return runs
            await asyncio.sleep(0.02)


def reserved(runs: list[dict[str, Any]]) -> list[float]:
    return sorted(
        datetime.fromisoformat(r["waiting_for"]["until"]).timestamp()
        for r in runs
        if (r["waiting_for"] or {}).get("reason") == "throttle"
    )


def starts_of(runs: list[dict[str, Any]]) -> list[float]:
    return sorted(started_at(r) for r in runs if r["status"] == "completed")


async def test_throttle_spreads_starts_and_drops_none(clocked: Api, clock: FakeClock) -> None:
    api, t0 = clocked, clock.now().timestamp()
    flow_id = await api.create_flow(
        span_flow(0.0, throttle={"limit": 2, "period_seconds": 0.5, "key": "{{ payload.k }}"})
    )
    ids = await execute_all(api, flow_id, [{"k": "partner"} for _ in range(6)])
    other = await api.execute(flow_id, {"k": "other"})
    # Two start at once; the rest are held with their reserved starts, two a half second.
    runs = await settle(api, ids, completed=2, held=4)
    assert starts_of(runs) == [t0, t0]
    assert reserved(runs) == [t0 + 0.5, t0 + 0.5, t0 + 1.0, t0 + 1.0]
    held = next(r for r in runs if held_back(r))["waiting_for"]
    assert held["reason"] == "throttle" and held["key"] == "partner"
    # Another key was not held behind them: it started at once.
    other_run = await api.wait(other)
    assert other_run["status"] == "completed" and started_at(other_run) == t0
    await advance(api, clock, 0.5)
    runs = await settle(api, ids, completed=4, held=2)
    assert starts_of(runs) == [t0, t0, t0 + 0.5, t0 + 0.5]
    await advance(api, clock, 0.5)
    runs = await settle(api, ids, completed=6, held=0)  # none dropped
    assert starts_of(runs) == [t0, t0, t0 + 0.5, t0 + 0.5, t0 + 1.0, t0 + 1.0]


async def test_concurrency_and_throttle_on_one_flow_both_hold(
    clocked: Api, clock: FakeClock
) -> None:
    """Combined: one at a time per customer, and at most two starts a second per
    customer; another customer is held behind neither."""
    api, t0 = clocked, clock.now().timestamp()
    per_customer = "{{ payload.k }}"
    flow_id = await api.create_flow(
        span_flow(
            0.05,
            concurrency={"limit": 1, "key": per_customer},
            throttle={"limit": 2, "period_seconds": 1.0, "key": per_customer},
        )
    )
    ids = await execute_all(api, flow_id, [{"k": "cus_1"} for _ in range(6)])
    other = await api.execute(flow_id, {"k": "cus_2"})
    other_run = await api.wait(other)
    # cus_2 started the moment it was queued: held behind neither of cus_1's caps
    assert other_run["status"] == "completed"
    assert other_run["queued_at"] == other_run["started_at"]
    # Each second of the clock: two of cus_1's runs, one after the other, then the next
    # is held for its throttled start (and the rest for the one slot).
    for second in range(3):
        runs = await settle(api, ids, completed=2 * second + 2, held=1 if second < 2 else 0)
        if second < 2:
            assert reserved(runs) == [t0 + second + 1]
        await advance(api, clock, 1.0)
    assert all(r["status"] == "completed" for r in runs), runs
    spans = [(r["steps"][0]["output"]["begun"], r["steps"][0]["output"]["ended"]) for r in runs]
    assert peak_overlap(spans) == 1
    assert starts_of(runs) == [t0, t0, t0 + 1, t0 + 1, t0 + 2, t0 + 2]


async def test_debounce_collapses_a_burst_into_one_run_with_the_last_payload(api: Api) -> None:
    flow_id = await api.create_flow(
        # a period far above the gaps between the executes: a loaded CI machine once let
        # one gap pass 0.4 s, which rightly started a second run
        span_flow(0.0, debounce={"period_seconds": 1.5, "key": "{{ payload.k }}"})
    )
    ids = []
    for i in range(5):
        ids.append(await api.execute(flow_id, {"k": "index", "n": i}))
        await asyncio.sleep(0.05)
    other = await api.execute(flow_id, {"k": "other", "n": 99})
    assert len(set(ids)) == 1 and other != ids[0]
    queued = await run_of(api, ids[0])
    assert queued["waiting_for"] == {"reason": "debounce", "key": "index", "until": None}
    run = await api.wait(ids[0])
    assert run["status"] == "completed" and run["payload"] == {"k": "index", "n": 4}
    started = datetime.fromisoformat(run["started_at"])
    assert started - datetime.fromisoformat(run["queued_at"]) >= timedelta(seconds=1.65)
    later = await api.execute(flow_id, {"k": "index", "n": 5})  # after it started: a new run
    assert later != ids[0]
    assert (await api.wait(later))["payload"]["n"] == 5


async def test_debounce_max_wait_starts_the_run_while_executes_keep_coming(
    clocked: Api, clock: FakeClock
) -> None:
    api = clocked
    flow_id = await api.create_flow(
        span_flow(0.0, debounce={"period_seconds": 0.3, "max_wait_seconds": 0.6})
    )
    ids = []
    for i in range(12):  # one every 0.1 s for 1.2 s: each would push the start back
        ids.append(await api.execute(flow_id, {"n": i}))
        await advance(api, clock, 0.1)
        if i == 5:  # 0.6 s: the first run's max_wait is up, so it starts though executes come
            await until(api, ids[0], lambda r: r["started_at"] is not None)
    # the first six joined one run; the next six another, started 0.6 s after its first
    assert ids == [ids[0]] * 6 + [ids[6]] * 6 and ids[0] != ids[6], ids
    for run_id in (ids[0], ids[6]):
        run = await api.wait(run_id)
        assert run["status"] == "completed"
        waited = datetime.fromisoformat(run["started_at"]) - datetime.fromisoformat(
            run["queued_at"]
        )
        assert waited == timedelta(seconds=0.6), run


async def test_keys_that_fail_answer_400_naming_the_field(api: Api) -> None:
    control = {
        "concurrency": {"limit": 1, "key": "{{ payload.customer.id }}"},
        "priority": "{{ 10 if payload.get('tier') == 'pro' else 0 }}",
    }
    flow_id = await api.create_flow(span_flow(**control))
    r = await api.post("/api/v1/flows/execute", {"flow_id": flow_id, "payload": {}})
    assert r.status_code == 400, r.text
    assert "concurrency.key" in r.json()["error"], r.text
    r = await api.post(
        "/api/v1/flows/execute", {"flow_id": flow_id, "payload": {"customer": {"id": [1]}}}
    )
    assert r.status_code == 400 and "concurrency.key" in r.json()["error"], r.text
    r = await api.post(
        "/api/v1/flows/execute", {"flow_id": flow_id, "payload": {"customer": {"id": 7}}}
    )
    assert r.status_code == 202, r.text
    run = await api.wait(r.json()["run_id"])
    assert run["priority"] == 0 and run["status"] == "completed"
    r = await api.post(
        "/api/v1/flows/execute",
        {"flow_id": flow_id, "payload": {"customer": {"id": 7}, "tier": "pro"}},
    )
    assert (await api.wait(r.json()["run_id"]))["priority"] == 10
    r = await api.post(
        "/api/v1/flows/execute",
        {"flow_id": flow_id, "payload": {"customer": {"id": 7}}, "priority": 101},
    )
    assert r.status_code == 400 and "priority" in r.text
    r = await api.post(
        "/api/v1/flows/execute",
        {"flow_id": flow_id, "payload": {"customer": {"id": 7}}, "priority": -5},
    )
    assert (await api.wait(r.json()["run_id"]))["priority"] == -5


async def test_a_definition_with_a_bad_control_is_refused_at_save(api: Api) -> None:
    for control, field in [
        ({"concurrency": {"limit": 0}}, "concurrency"),
        ({"concurrency": {"limit": 1, "key": "{{ payload. }}"}}, "concurrency.key"),
        ({"throttle": {"limit": 1}}, "throttle"),
        ({"debounce": {"period_seconds": 1, "key": "{{ steps.sync.output }}"}}, "debounce.key"),
        ({"priority": 500}, "priority"),
    ]:
        r = await api.post("/api/v1/flows", span_flow(**control))
        assert r.status_code == 400, (control, r.text)
        assert field in r.json()["error"], (control, r.text)


async def test_due_runs_are_claimed_highest_priority_first_then_oldest(db: Database) -> None:
    clock = FakeClock()
    now = clock.now()
    made: dict[str, tuple[int, int]] = {}
    async with db.transaction() as conn:
        for age, priority in [(5, 0), (4, -3), (3, 10), (2, 0), (1, 10), (0, 50), (6, -3)]:
            run = Run(new_id("run"), "ws_p", Mode.TEST, "wf_p", 1, "api", RunStatus.QUEUED, {},
                      now - timedelta(seconds=age), priority=priority)  # fmt: skip
            await runs_store.insert_run(conn, run)
            made[run.run_id] = (priority, age)
    order: list[tuple[int, int]] = []
    for _ in range(4):  # two at a time: each claim takes the best two left
        async with db.transaction() as conn:
            claimed = await runs_store.claim_runs(
                conn, owner="w", now=now, lease_until=now + timedelta(seconds=30), limit=2
            )
        order += sorted((made[r.run_id] for r in claimed), key=lambda p: (-p[0], -p[1]))
    assert order == [(50, 0), (10, 3), (10, 1), (0, 5), (0, 2), (-3, 6), (-3, 4)]
