"""The events about a run (flowhook.events) and the executor's helpers that build records
and final events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson

from flowhook.engine.durable import Attempt as _Attempt
from flowhook.engine.durable import next_attempt as _next_attempt
from flowhook.engine.steps import Outcome, build_step
from flowhook.engine.writer import ended_event as _ended_event
from flowhook.events import cancelled_event, elapsed_ms, run_duration_ms, run_event
from flowhook.store.models import Mode, Run, RunStatus, RunStep, StepStatus

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def a_run(**kw: object) -> Run:
    fields: dict[str, object] = {
        "run_id": "run_01",
        "workspace_id": "ws",
        "mode": Mode.TEST,
        "flow_id": "wf_01",
        "flow_version": 3,
        "trigger": "api",
        "status": RunStatus.RUNNING,
        "payload": {},
        "queued_at": T0,
    }
    return Run(**{**fields, **kw})  # type: ignore[arg-type]


def test_elapsed_ms_rounds_and_is_never_negative() -> None:
    assert elapsed_ms(T0, T0 + timedelta(seconds=1.2344)) == 1234
    assert elapsed_ms(T0, T0 + timedelta(microseconds=1600)) == 2
    assert elapsed_ms(T0 + timedelta(seconds=1), T0) == 0


def test_run_duration_is_from_its_start_or_none() -> None:
    assert run_duration_ms(a_run(), T0 + timedelta(seconds=5)) is None
    assert run_duration_ms(a_run(started_at=T0), T0 + timedelta(seconds=5)) == 5000


def test_run_event_carries_the_run_in_its_envelope() -> None:
    event = run_event(a_run(), "flow.started", {"status": "running"}, T0)
    assert (event.type, event.workspace_id, event.mode) == ("flow.started", "ws", Mode.TEST)
    assert (event.flow_id, event.run_id, event.created_at) == ("wf_01", "run_01", T0)
    body = orjson.loads(event.body)
    assert (body["event"], body["flow_id"], body["run_id"]) == ("flow.started", "wf_01", "run_01")
    assert body["payload"] == {"status": "running"}


def test_cancelled_event_reports_the_steps_executed_and_the_duration() -> None:
    started = a_run(started_at=T0, steps_executed=2)
    payload = orjson.loads(cancelled_event(started, T0 + timedelta(seconds=3)).body)["payload"]
    assert payload == {"status": "cancelled", "steps_executed": 2, "duration_ms": 3000}
    queued = a_run(status=RunStatus.QUEUED)
    payload = orjson.loads(cancelled_event(queued, T0).body)["payload"]
    assert payload == {"status": "cancelled", "steps_executed": 0, "duration_ms": None}


def test_ended_event_puts_the_summary_after_the_output() -> None:
    values = {"steps_executed": 1, "duration_ms": 7, "output": {"x": 1}, "error": None}
    done = _ended_event(a_run(), RunStatus.COMPLETED, values, T0)
    assert done.type == "flow.completed"
    assert done.body.endswith(
        b'"payload":{"x":1,"status":"completed","steps_executed":1,"duration_ms":7}}'
    )
    error = {"type": "fail", "message": "no", "step": "a"}
    failed = _ended_event(a_run(), RunStatus.FAILED, {**values, "error": error}, T0)
    assert failed.type == "flow.failed"
    assert orjson.loads(failed.body)["payload"] == {
        "status": "failed",
        "error": error,
        "steps_executed": 1,
        "duration_ms": 7,
    }


def test_next_attempt_counts_interrupted_attempts() -> None:
    def record(status: StepStatus, attempts: int, interrupted: tuple[int, ...] = ()) -> RunStep:
        return RunStep(
            idx=0,
            step_id="a",
            type="http",
            status=status,
            attempts=attempts,
            interrupted=interrupted,
        )

    assert _next_attempt(None) == (1, ())
    assert _next_attempt(record(StepStatus.RUNNING, 2, (1,))) == (3, (1, 2))
    assert _next_attempt(record(StepStatus.RETRYING, 2, (1,))) == (3, (1,))
    assert _next_attempt(record(StepStatus.COMPLETED, 4)) == (1, ())


def test_an_attempt_records_its_outcome() -> None:
    step = build_step({"id": "t", "type": "transform", "output": {}})
    attempt = _Attempt(step, 4, 2, (1,), T0)
    outcome = Outcome(output={"y": 1})
    record = attempt.record(StepStatus.COMPLETED, T0 + timedelta(milliseconds=30), outcome)
    assert record == RunStep(
        idx=4,
        step_id="t",
        type="transform",
        status=StepStatus.COMPLETED,
        attempts=2,
        started_at=T0,
        finished_at=T0 + timedelta(milliseconds=30),
        duration_ms=30,
        output={"y": 1},
        error=None,
        interrupted=(1,),
    )
