"""Why a run is not executing a step right now (``waiting_for``), from what its record holds.

A queued run waits for an engine worker to take it (``worker``), unless flow control holds it
back (``concurrency``, ``throttle``, ``debounce``: :attr:`flowhook.store.models.Run.waiting_for`).
A running run that sleeps does so in one step of its own (not a branch's or an item's): the
step's record says what for. ``delay``, ``signal`` (a ``wait`` step), ``approval``, ``child``
(a ``flow`` step), ``parts`` (a ``parallel`` or ``map`` step), ``retry`` (a failed attempt's
backoff); ``task`` needs a read of the task (who holds it), done by the caller.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from flowhook.store.models import Run, RunStatus, RunStep, StepStatus

__all__ = ["sleeping_step", "why_queued", "why_sleeping"]

_SLEEPING = (StepStatus.WAITING, StepStatus.RETRYING)


def sleeping_step(run: Run) -> RunStep | None:
    """The step of the run itself that a running run sleeps in, if any."""
    if run.status is not RunStatus.RUNNING:
        return None
    for step in reversed(run.steps):
        if step.parent is None and step.status in _SLEEPING:
            return step
    return None


def why_queued(run: Run) -> dict[str, Any] | None:
    """A queued run: what flow control holds it back for, else that it waits for a worker."""
    if run.status is not RunStatus.QUEUED:
        return None
    held = run.waiting_for
    if held is not None:
        return held
    return {"reason": "worker", "since": run.queued_at}


def why_sleeping(run: Run, step: RunStep) -> dict[str, Any] | None:
    """What ``step`` (:func:`sleeping_step`) waits for, but a task (which needs a read)."""
    out = step.output if isinstance(step.output, dict) else {}
    base: dict[str, Any] = {"step_id": step.step_id}
    if step.status is StepStatus.RETRYING:
        return {"reason": "retry", **base, "attempt": step.attempts + 1, "until": run.due_at}
    until = _time(out.get("until"))
    match step.type:
        case "delay":
            return {"reason": "delay", **base, "until": until}
        case "wait":
            return {"reason": "signal", **base, "name": out.get("signal"),
                    "match": out.get("match") or {}, "until": until}  # fmt: skip
        case "approval":
            return {"reason": "approval", **base, "until": until}
        case "flow":
            return {"reason": "child", **base, "run_id": out.get("run_id"), "until": until}
        case "parallel" | "map":
            counts = Counter(str(status) for _, status in step.parts)
            return {"reason": "parts", **base, "parts": dict(sorted(counts.items())),
                    "until": until}  # fmt: skip
    return None


def _time(value: Any) -> datetime | str | None:
    """A step record's ``until`` (stored as ISO text): a datetime where it parses."""
    if not isinstance(value, str):
        return value if isinstance(value, datetime) else None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
