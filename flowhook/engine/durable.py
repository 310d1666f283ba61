"""The seam between the executor's loop and the step types that suspend a run.

A step whose run must wait for something outside its attempt (a time, a signal, a person, a
child run, its own parts) owns how it waits and how it wakes: it is :class:`Suspending`, and
the loop only hands it the run's :class:`Cursor` when the step is reached (``park``) and
when its sleeping run is claimed again (``wake``). The cursor is all a step's durable half
sees of the run and the engine: its pending writes, the commit that releases the run until
a time, the way on after a result. A unit test drives a step's durable half with a fake
cursor and a fake store, no database and no clock.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson

from flowhook.definition.sandbox import weight
from flowhook.engine.steps.base import Action
from flowhook.events import elapsed_ms
from flowhook.store.models import Event, Run, RunStatus, RunStep, StepStatus
from flowhook.store.types import json_has_nul

if TYPE_CHECKING:
    from flowhook.engine.cursor import Pending
    from flowhook.engine.steps.base import Context, Outcome, Step
    from flowhook.store.db import Connection as AsyncConnection
    from flowhook.store.runs import Progress

__all__ = [
    "Attempt",
    "Cursor",
    "Suspending",
    "check_output",
    "next_attempt",
    "output_problem",
    "released",
]


@dataclass(slots=True)
class Attempt:
    """One attempt of step ``idx``: its number, the attempts interrupted before it and when it
    started."""

    step: Step
    idx: int
    number: int
    interrupted: tuple[int, ...]
    started: datetime

    def record(self, status: StepStatus, finished: datetime, outcome: Outcome) -> RunStep:
        """The attempt's step record once it has ``outcome``."""
        return RunStep(
            idx=self.idx,
            step_id=self.step.id,
            type=self.step.type,
            status=status,
            attempts=self.number,
            started_at=self.started,
            finished_at=finished,
            duration_ms=elapsed_ms(self.started, finished),
            output=outcome.output,
            error=outcome.error,
            interrupted=self.interrupted,
        )

    def waiting(self, output: Any) -> RunStep:
        """The attempt's record while its run sleeps in the step."""
        return RunStep(
            idx=self.idx,
            step_id=self.step.id,
            type=self.step.type,
            status=StepStatus.WAITING,
            attempts=self.number,
            started_at=self.started,
            output=output,
        )


class Cursor(Protocol):
    """A run in the executor's hands, as a suspending step's durable half uses it."""

    run: Run
    ctx: Context
    pending: Pending
    idx: int
    """The step the run is at."""
    deadline: datetime
    """When the run's ``timeout_seconds`` is up."""

    @property
    def timeout(self) -> float:
        """The run's ``timeout_seconds``."""

    @property
    def public_url(self) -> str:
        """Where people reach this service (approval links start with it)."""

    @property
    def max_run_tree(self) -> int:
        """``FLOWHOOK_MAX_RUN_TREE``: the runs one top-level run's tree may start."""

    def now(self) -> datetime: ...

    def read(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

    def add(self, record: RunStep) -> None:
        """Add a step record to what is pending (a ``waiting`` one, say)."""

    def record(self, record: RunStep) -> None:
        """Add a step's final record, its event, and what later steps see of it (the caller
        moves :attr:`idx` on)."""

    def progress(self, *, wake: datetime | None = None) -> Progress:
        """What is pending with the run's progress, still ``running``, as one write; released
        (no lease) until ``wake`` when given."""

    async def apply(self, progress: Progress) -> None:
        """Write ``progress`` in the (group) write its run's progress goes through; raises
        ``LeaseLost`` when its guard refuses it."""

    async def apply_in(self, conn: AsyncConnection, progress: Progress) -> None:
        """Write ``progress`` in the transaction of ``conn``; raises ``LeaseLost`` likewise."""

    def written(self) -> None:
        """What was pending is written (by :meth:`apply` or :meth:`apply_in`)."""

    async def sleep_until(self, wake: datetime) -> RunStatus:
        """Commit what is pending and give the run back until ``wake`` (no lease)."""

    async def done(
        self, step: Step, record: RunStep, outcome: Outcome, *, durable: bool = False
    ) -> RunStatus | None:
        """The step at :attr:`idx` ended with ``record``: record it and go on as ``outcome``
        says (``durable``: its result is stored where a resumed run finds it again, so it
        needs no commit of its own). The status the run is left in, or ``None`` to go on."""

    async def failed(self, attempt: Attempt, type_: str, message: str) -> RunStatus | None:
        """The attempt fails its step with ``type_`` and ``message``."""

    def step_event(self, step: RunStep, *, will_retry: bool) -> Event:
        """The ``flow.step_completed`` or ``flow.step_failed`` of a step record."""

    def check_output(self, outcome: Outcome) -> None:
        """Fail ``outcome`` whose output cannot be stored (not JSON, too large)."""

    def under_step(self, attempt: Attempt) -> str:
        """The trace context of a run the attempt starts (a child run, a part)."""

    async def see_branches(self, idx: int) -> None:
        """Let later steps reach the steps of the branches of the ``parallel`` step at
        ``idx``, which just ended, as ``steps.<id>``."""


@runtime_checkable
class Suspending(Protocol):
    """A step type whose run sleeps in it, holding no worker: it returns
    :attr:`~flowhook.engine.steps.base.Action.SUSPEND`, then its durable half takes over."""

    async def park(self, cur: Cursor, attempt: Attempt, outcome: Outcome) -> RunStatus | None:
        """The step reached, its attempt's ``outcome`` says what it waits for: write the run
        asleep in it (or go on at once when what it waits for is there)."""

    async def wake(self, cur: Cursor, prior: RunStep, now: datetime) -> RunStatus | None:
        """The run sleeping in the step (its record ``prior``) was claimed: go on when what it
        waited for came or its time is up, else sleep again."""


def released(wake: datetime) -> dict[str, Any]:
    """The run's values when it is given back until ``wake``: no lease, and the lost-worker
    count starts again."""
    return {
        "available_at": wake,
        "due_at": wake,
        "lease_owner": None,
        "lease_expires_at": None,
        "claims": 0,
    }


def next_attempt(prior: RunStep | None) -> tuple[int, tuple[int, ...]]:
    """The number of a step's next attempt, and its attempts interrupted so far, from its
    record (``None`` before its first attempt)."""
    if prior is None:
        return 1, ()
    if prior.status is StepStatus.RUNNING:  # the attempt in flight at a crash
        return prior.attempts + 1, (*prior.interrupted, prior.attempts)
    if prior.status is StepStatus.RETRYING:
        return prior.attempts + 1, prior.interrupted
    return 1, ()


def output_problem(output: Any, limit: int) -> str | None:
    """Why ``output`` may not be stored (not JSON, or more than ``limit`` bytes as JSON), or
    ``None``. Its size is estimated first, so a huge value is never serialised."""
    if weight(output, limit) > limit:
        return f"output is larger than {limit} bytes (FLOWHOOK_MAX_STEP_OUTPUT_BYTES)"
    try:
        encoded = orjson.dumps(output)
    except TypeError as exc:
        return f"output is not JSON: {exc}"
    if len(encoded) > limit:
        return f"output is {len(encoded)} bytes, more than {limit} (FLOWHOOK_MAX_STEP_OUTPUT_BYTES)"
    if json_has_nul(encoded):
        return "output contains the NUL character (\\u0000), which cannot be stored"
    return None


def check_output(outcome: Outcome, limit: int) -> None:
    """A step output must be JSON and at most ``limit`` bytes; one that is not fails the step
    (instead of the worker) and is not stored."""
    problem = output_problem(outcome.output, limit)
    if problem is not None:
        outcome.output = None
        outcome.error = {"type": "output", "message": problem}
        outcome.action = Action.FAIL
