"""The span of a step attempt, a child of its run row's span (a run, a child run or a part;
:func:`flowhook.tracing.run_span`), in the tree :mod:`flowhook.tracing` describes. Called
only while spans are exported (``tracing.ENABLED``); its id is derived, so the span and the
``traceparent`` its request carried agree across processes and crashes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flowhook import tracing
from flowhook.engine.steps import Outcome, Step
from flowhook.store.models import Run

__all__ = ["step_span"]


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
        **tracing.run_attributes(run),
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
