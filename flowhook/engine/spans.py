"""The engine's OpenTelemetry spans: one per run row (a run, a child run or a part) and one
per step attempt, in the tree :mod:`flowhook.tracing` describes. Called only while spans
are exported (``tracing.ENABLED``); their ids are derived, so a run's span and its steps'
spans agree across processes and crashes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flowhook import tracing
from flowhook.engine.steps import Outcome, Step
from flowhook.store.models import Run, RunStatus

__all__ = ["run_attributes", "step_span", "run_span"]


def run_attributes(run: Run) -> dict[str, Any]:
    """``flowhook.run_id`` is the run people see (a part's root run); a part names itself
    in ``flowhook.part_id``."""
    attributes: dict[str, Any] = {
        "flowhook.run_id": run.root_run_id or run.run_id,
        "flowhook.flow_id": run.flow_id,
        "flowhook.flow_version": run.flow_version,
    }
    if run.root_run_id is not None:
        attributes["flowhook.part_id"] = run.run_id
    return attributes


def step_span(
    run: Run,
    step: Step,
    idx: int,
    attempt: int,
    started: datetime,
    finished: datetime,
    outcome: Outcome | None,
    extra: dict[str, Any] | None,
) -> None:
    """Export the span of one step attempt, a child of its run row's span (``outcome``
    ``None``: the run's time ran out during it)."""
    trace = tracing.run_trace(run.run_id, run.traceparent)
    under = tracing.TraceParent(trace.trace_id, tracing.run_span_id(run.run_id), trace.flags)
    attributes = {
        **run_attributes(run),
        "flowhook.step_id": step.id,
        "flowhook.step_type": step.type,
        "flowhook.step_attempt": attempt,
        **(extra or {}),
    }
    error = None
    if outcome is None:
        error = "timeout"
    elif outcome.error is not None:
        error = str(outcome.error.get("type", "error"))
    tracing.emit(
        f"step {step.id}", trace=under, span_id=tracing.step_span_id(run.run_id, idx, attempt),
        start_at=started, end_at=finished, kind="client" if step.type == "http" else "internal",
        attributes=attributes, error=error,
    )  # fmt: skip


def run_span(run: Run, status: RunStatus, values: dict[str, Any], now: datetime) -> None:
    """Export the span of a run row that ended: from its queueing to its end, under the
    context it stored (the accept span, the step that started it, or none)."""
    attributes = {**run_attributes(run), "flowhook.run.status": str(status)}
    attributes["flowhook.trigger"] = run.trigger
    error = None
    if status is RunStatus.FAILED:
        error = str((values.get("error") or {}).get("type", "failed"))
    elif status is RunStatus.CANCELLED:
        error = "cancelled"
    name = "part" if run.root_run_id is not None else "run"
    tracing.emit(
        f"{name} {run.flow_id}", trace=tracing.run_trace(run.run_id, run.traceparent),
        span_id=tracing.run_span_id(run.run_id), start_at=run.queued_at, end_at=now,
        kind="consumer" if name == "run" else "internal", attributes=attributes, error=error,
        remote_parent=True,
    )  # fmt: skip
