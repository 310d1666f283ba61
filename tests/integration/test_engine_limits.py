"""Limits the engine holds on both backends: a step output's size, and a step that raises
fails that step (by its retry rules) instead of leaving its run stuck."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from flowhook.clock import FakeClock
from flowhook.config import Settings
from flowhook.engine.executor import CompiledFlow, Executor
from flowhook.engine.steps import Context, Outcome, StepEnv
from flowhook.service import Services
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, RunStatus, StepStatus
from tests.conftest import Api

CAP = 4096


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_step_output_bytes": CAP})


def test_the_output_cap_defaults_to_256_kib_and_reads_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().max_step_output_bytes == 256 * 1024
    monkeypatch.setenv("FLOWHOOK_MAX_STEP_OUTPUT_BYTES", "5000")
    assert Settings().max_step_output_bytes == 5000


async def test_a_step_output_over_the_cap_fails_the_step_and_is_not_stored(api: Api) -> None:
    flow_id = await api.create_flow(
        {
            "name": "big",
            "steps": [
                {"id": "small", "type": "transform", "output": {"s": "{{ 'x' * 3000 }}"}},
                {"id": "big", "type": "transform", "output": {"s": "{{ 'x' * 5000 }}"}},
                {"id": "never", "type": "transform", "output": {}},
            ],
        }
    )
    run = await api.wait(await api.execute(flow_id))
    assert run["status"] == "failed"
    small, big = run["steps"]
    assert small["status"] == "completed" and len(small["output"]["s"]) == 3000
    assert big["status"] == "failed" and big["output"] is None
    assert big["error"]["type"] == "output"
    assert "FLOWHOOK_MAX_STEP_OUTPUT_BYTES" in big["error"]["message"]
    assert run["error"]["step"] == "big"
    events = (await api.get(f"/api/v1/flows/runs/{run['run_id']}/events")).json()["data"]
    assert events and not any("x" * 5000 in str(e) for e in events)


async def test_a_flow_output_over_the_cap_fails_the_run(api: Api) -> None:
    flow_id = await api.create_flow(
        {
            "name": "big-output",
            "steps": [{"id": "a", "type": "transform", "output": {"n": 1}}],
            "output": {"a": "{{ 'y' * 3000 }}", "b": "{{ 'y' * 3000 }}"},
        }
    )
    run = await api.wait(await api.execute(flow_id))
    assert run["status"] == "failed" and run["output"] is None
    assert "FLOWHOOK_MAX_STEP_OUTPUT_BYTES" in run["error"]["message"]


class _Raising:
    """A step whose code raises something no step catches (as a bad header value did in
    aiohttp): the executor must fail the step, not leave the run to its lease."""

    type = "transform"
    pure = True
    external = False
    timeout = None

    def __init__(self, step_id: str, retry: dict[str, Any] | None) -> None:
        self.id = step_id
        self.retry = retry

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        raise ValueError(f"bad header on attempt {env.attempt}")


async def _run_with_raising_step(
    services: Services, db: Database, retry: dict[str, Any] | None
) -> tuple[str, list[RunStatus | None]]:
    clock = FakeClock()
    definition = {
        "name": "raises",
        "steps": [
            {"id": "boom", "type": "transform", "output": {}},
            {"id": "after", "type": "transform", "output": {"ok": True}},
        ],
    }
    created = await services.keys.create(Mode.TEST, "ws")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    flow = await services.flows.create(who, definition)
    services.runs._clock = clock  # type: ignore[attr-defined]
    run_id = (await services.runs.start(who, flow_id=flow.flow_id, payload={})).run.run_id
    compiled = CompiledFlow.build(definition)
    compiled.steps[0] = _Raising("boom", retry)
    left: list[RunStatus | None] = []
    for _ in range(3):
        executor = Executor(db, clock, "w")
        executor.flows.put(flow.flow_id, flow.version, compiled)  # the step that raises
        now = clock.now()
        async with db.transaction() as conn:
            claimed = await runs_store.claim_runs(
                conn, owner="w", now=now, lease_until=now + timedelta(seconds=30), limit=1
            )
        if claimed:
            left.append(await executor.execute(claimed[0]))
        clock.advance(2)
    return run_id, left


async def test_a_step_that_raises_fails_that_step_with_an_internal_error(
    services: Services, db: Database
) -> None:
    run_id, left = await _run_with_raising_step(services, db, None)
    assert left == [RunStatus.FAILED]
    async with db.read() as conn:
        run = await runs_store.get_run_by_id(conn, run_id)
    assert run is not None and run.status is RunStatus.FAILED
    assert run.error == {
        "type": "internal",
        "message": "ValueError: bad header on attempt 1",
        "step": "boom",
    }
    [step] = run.steps
    assert (step.status, step.attempts) == (StepStatus.FAILED, 1)


async def test_a_step_that_raises_is_retried_by_its_rules(services: Services, db: Database) -> None:
    run_id, left = await _run_with_raising_step(
        services, db, {"max_attempts": 2, "backoff_seconds": 1}
    )
    assert left == [RunStatus.RUNNING, RunStatus.FAILED]  # released for the retry, then failed
    async with db.read() as conn:
        run = await runs_store.get_run_by_id(conn, run_id)
    assert run is not None and run.status is RunStatus.FAILED
    assert run.error is not None and run.error["message"] == "ValueError: bad header on attempt 2"
    [step] = run.steps
    assert (step.status, step.attempts) == (StepStatus.FAILED, 2)


async def test_a_step_output_holding_nul_fails_that_run_alone(api: Api) -> None:
    """PostgreSQL's jsonb cannot keep NUL: such an output must fail its own step, not the
    engine's group write that other tenants' runs share."""
    nul = await api.create_flow(
        {
            "name": "nul",
            "steps": [{"id": "t", "type": "transform", "output": {"v": '{{ "a\\x00b" }}'}}],
        }
    )
    fine = await api.create_flow(
        {"name": "fine", "steps": [{"id": "t", "type": "transform", "output": {"v": "ok"}}]},
        who="other",
    )
    bad_runs = [await api.execute(nul) for _ in range(3)]
    good_runs = [await api.execute(fine, who="other") for _ in range(3)]
    for run_id in bad_runs:
        run = await api.wait(run_id)
        assert run["status"] == "failed", run
        assert run["error"]["type"] == "output" and "NUL" in run["error"]["message"]
    for run_id in good_runs:
        assert (await api.wait(run_id, who="other"))["status"] == "completed"
