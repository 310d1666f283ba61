"""``task``: work done by a worker in the team's own code (the SDK's ``Worker``, or any
process speaking the worker protocol, docs/workers.md). The step queues a task named
``task`` with its evaluated ``input`` and its run sleeps, holding no engine worker, until a
worker of the same workspace and mode finishes it; its output is what the worker returned.

Each claim is an attempt: ``timeout_seconds`` bounds one (error type ``timeout``), and a
worker that stops heartbeating for ``heartbeat_seconds`` (default 30) loses it to the next
claim, which is the next attempt (the one cut short is listed as interrupted). A failed
attempt is tried again after the step's ``retry`` backoff unless the worker said it may not
be (``retryable: false``) or the attempts are used up; then the step fails with error type
``task`` and the worker's message."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.retry import backoff_seconds
from flowhook.engine.steps.base import Action, Context, Outcome, StepBase, StepEnv, error
from flowhook.events import elapsed_ms
from flowhook.ids import new_id
from flowhook.store import tasks as tasks_store
from flowhook.store.models import RunStatus, RunStep, StepStatus
from flowhook.store.tasks import Task

if TYPE_CHECKING:
    from flowhook.engine.durable import Attempt, Cursor
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["TaskStep", "TaskStore", "DEFAULT_HEARTBEAT"]

DEFAULT_HEARTBEAT = 30.0


class TaskStore(Protocol):
    """What a ``task`` step reads and writes of tasks (:mod:`flowhook.store.tasks`)."""

    async def insert(self, conn: AsyncConnection, task: Task) -> None: ...

    async def for_step(
        self, conn: AsyncConnection, run_id: str, idx: int, *, lock: bool = True
    ) -> Task | None: ...

    async def time_out(
        self, conn: AsyncConnection, task: Task, now: datetime, message: str
    ) -> bool: ...

    async def retry(self, conn: AsyncConnection, task: Task, at: datetime) -> None: ...


class TaskStep(StepBase, kind="task", pure=True, external=False):
    # Pure: its attempt only evaluates the input (the task is queued by ``park``, in the commit
    # that puts the run to sleep), so the steps before it are committed with that, not apart.
    store: TaskStore = tasks_store

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.task: str = spec["task"]
        self._input = compile_value(spec.get("input"))
        self.heartbeat: float = float(spec.get("heartbeat_seconds", DEFAULT_HEARTBEAT))

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """The task to queue: ``{"task", "input"}``, suspending the run."""
        try:
            value = await evaluate(self._input, ctx)
        except ExpressionError as exc:
            return error("expression", f"input: {exc}")
        return Outcome(output={"task": self.task, "input": value}, action=Action.SUSPEND)

    async def park(self, cur: Cursor, attempt: Attempt, outcome: Outcome) -> RunStatus:
        """Queue the task and sleep until its end wakes the run (or the run's time is up):
        the task and the step's ``waiting`` record are one commit (the task is written only if
        the run's guarded write applied: a worker that lost the run queues nothing)."""
        run, now = cur.run, cur.now()
        task = Task(
            task_id=new_id("tsk"), workspace_id=run.workspace_id, mode=run.mode,
            task=self.task, run_id=run.run_id, idx=attempt.idx,
            root_run_id=run.root_run_id or run.run_id, flow_id=run.flow_id, step_id=self.id,
            input=outcome.output["input"], status="queued", attempt=0, available_at=now,
            heartbeat_seconds=self.heartbeat, created_at=now, timeout_seconds=self.timeout,
            traceparent=cur.under_step(attempt),
        )  # fmt: skip
        cur.add(attempt.waiting({"task_id": task.task_id, "task": self.task}))
        store = self.store

        async def queue(conn: AsyncConnection) -> None:  # once the run's write applied
            await store.insert(conn, task)

        # the group write every run's progress goes through: many runs' tasks, one commit
        await cur.apply(replace(cur.progress(wake=cur.deadline), after=queue))
        cur.written()
        return RunStatus.RUNNING

    async def wake(self, cur: Cursor, prior: RunStep, now: datetime) -> RunStatus | None:
        """The task completed (the step takes its output), failed for good (the step fails),
        failed with attempts left (queued again after the backoff, its ``flow.step_failed``
        saying ``will_retry``), its attempt's time is up (a failed attempt, likewise), or it
        still goes (the run sleeps again)."""
        async with cur.read() as conn:  # most wake-ups: the task completed, which is final
            task = await self.store.for_step(conn, cur.run.run_id, cur.idx, lock=False)
        if task is not None and task.status == "completed":
            return await self._ended(cur, prior, now, task, None)
        async with cur.transaction() as conn:
            task = await self.store.for_step(conn, cur.run.run_id, cur.idx)
            if task is None:
                return await self._ended(cur, prior, now, None, _gone())
            late = task.attempt_deadline is not None and now >= task.attempt_deadline
            if task.status == "running" and late:
                message = f"the task's attempt {task.attempt} took longer than {self.timeout:g} s"
                await self.store.time_out(conn, task, now, message)
            if task.status == "failed":
                again = self._retry_after(task)
                if again is not None:
                    await self.store.retry(conn, task, now + timedelta(seconds=again))
                    return await self._retrying(cur, conn, prior, task, now)
            if task.status in ("queued", "running"):
                await cur.apply_in(conn, cur.progress(wake=_wake_at(task, cur.deadline)))
                cur.written()
                return RunStatus.RUNNING
        if task.status == "completed":
            return await self._ended(cur, prior, now, task, None)
        return await self._ended(cur, prior, now, task, _failure(task))

    def _retry_after(self, task: Task) -> float | None:
        """Seconds until a failed task's next attempt; ``None``: it may not be tried again."""
        if not task.retryable:
            return None
        return backoff_seconds(self.retry, task.attempt - len(task.interrupted))

    async def _retrying(
        self, cur: Cursor, conn: AsyncConnection, prior: RunStep, task: Task, now: datetime
    ) -> RunStatus:
        """The failed attempt's event (``will_retry``), and the step's record, still
        ``waiting`` (for the task's next attempt) with the failed one's number and error, in
        the write that puts the run back to sleep until the task's next end."""
        failed = replace(
            prior, status=StepStatus.RETRYING, attempts=task.attempt,
            interrupted=tuple(task.interrupted), finished_at=now,
            duration_ms=elapsed_ms(prior.started_at or now, now), error=task.error,
        )  # fmt: skip
        cur.pending.events.append(cur.step_event(failed, will_retry=True))
        cur.add(replace(failed, status=StepStatus.WAITING, finished_at=None, duration_ms=None))
        await cur.apply_in(conn, cur.progress(wake=cur.deadline))
        cur.written()
        return RunStatus.RUNNING

    async def _ended(
        self,
        cur: Cursor,
        prior: RunStep,
        now: datetime,
        task: Task | None,
        failure: dict[str, Any] | None,
    ) -> RunStatus | None:
        ended = replace(
            prior,
            attempts=task.attempt if task is not None else prior.attempts,
            interrupted=tuple(task.interrupted) if task is not None else prior.interrupted,
            finished_at=now,
            duration_ms=elapsed_ms(prior.started_at or now, now),
        )
        if failure is not None:
            failed = replace(ended, status=StepStatus.FAILED, output=None, error=failure)
            return await cur.done(self, failed, Outcome(error=failure, action=Action.FAIL))
        assert task is not None
        outcome = Outcome(output=task.output)
        cur.check_output(outcome)
        if outcome.error is not None:
            failed = replace(ended, status=StepStatus.FAILED, output=None, error=outcome.error)
            return await cur.done(self, failed, outcome)
        completed = replace(ended, status=StepStatus.COMPLETED, output=task.output)
        # the output is stored (the task's row): found again after a crash
        return await cur.done(self, completed, outcome, durable=True)


def _wake_at(task: Task, deadline: datetime) -> datetime:
    """When the run wakes by itself: at its deadline, or sooner when the attempt's is."""
    if task.status == "running" and task.attempt_deadline is not None:
        return min(task.attempt_deadline, deadline)
    return deadline


def _failure(task: Task) -> dict[str, Any]:
    """The step's error for a task that failed for good: the worker's message, type
    ``task`` (``timeout`` when its last attempt ran out of time)."""
    said = task.error or {}
    kind = "timeout" if said.get("type") == "timeout" else "task"
    failure: dict[str, Any] = {"type": kind, "message": str(said.get("message") or "failed")}
    if kind == "task" and said.get("type"):
        failure["worker_type"] = said["type"]
    failure["task_id"] = task.task_id
    return failure


def _gone() -> dict[str, Any]:
    return {"type": "task", "message": "the step's task is gone"}
