"""A run in the executor's hands: where it is, what it has not committed yet, and every way
its progress is written (see :class:`~flowhook.engine.durable.Cursor`, the part a step's
durable half uses)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flowhook import tracing
from flowhook.engine import metrics
from flowhook.engine.durable import Attempt, check_output, released
from flowhook.engine.parts import see_branches
from flowhook.engine.steps import Context, Outcome, Step
from flowhook.engine.steps.base import Action
from flowhook.engine.steps.base import error as failure
from flowhook.events import run_event
from flowhook.store import runs as runs_store
from flowhook.store.models import Event, Run, RunStatus, RunStep, StepStatus

if TYPE_CHECKING:
    from flowhook.engine.compiled import CompiledFlow
    from flowhook.engine.writer import RunWriter
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["Pending", "RunCursor", "nesting"]


@dataclass(slots=True)
class Pending:
    """Writes not yet committed: step rows, events and the run's new values."""

    steps: list[RunStep] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.steps or self.events or self.values)

    def start(self, run: Run, now: datetime, *, observe: bool = True) -> None:
        """A queued run starts now (``flow.started``, committed with what follows)."""
        run.started_at = now
        self.values["started_at"] = now
        if run.held is not None:  # a debounced run: it starts, nothing holds it now
            self.values["held"] = None
            run.held = None
        if observe:
            metrics.START_LATENCY.observe(max(0.0, (now - run.queued_at).total_seconds()))
        payload = {"status": "running", "trigger": run.trigger, "flow_version": run.flow_version}
        self.events.append(run_event(run, "flow.started", payload, now))


@dataclass(slots=True)
class RunCursor:
    """A run being executed: its place, its uncommitted writes, the context its steps see."""

    writer: RunWriter
    run: Run
    flow: CompiledFlow
    earlier: dict[int, RunStep]
    """The step records earlier claims committed, by index."""
    ctx: Context
    deadline: datetime
    """When the run's ``timeout_seconds`` is up."""
    idx: int
    """The step to run next."""
    pending: Pending
    skip_to: str | None = None
    """A ``goto`` target: the steps before it are skipped."""
    ended: bool = False
    """A step ended the run early (``end``): what is left is the flow's output."""

    # -- what a step's durable half reads --------------------------------------------------

    @property
    def timeout(self) -> float:
        return self.flow.timeout

    @property
    def public_url(self) -> str:
        return self.writer.public_url

    @property
    def max_run_tree(self) -> int:
        return self.writer.max_run_tree

    def now(self) -> datetime:
        return self.writer.clock.now()

    def read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return self.writer.db.read()

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return self.writer.db.transaction()

    def under_step(self, attempt: Attempt) -> str:
        span_id = tracing.step_span_id(self.run.run_id, attempt.idx, attempt.number)
        return tracing.child_traceparent(self.run.run_id, self.run.traceparent, span_id)

    def check_output(self, outcome: Outcome) -> None:
        check_output(outcome, self.writer.max_output)

    async def see_branches(self, idx: int) -> None:
        await see_branches(self.writer.db, self.run, {}, self.ctx, idxs=[idx])

    # -- writes ----------------------------------------------------------------------------

    def add(self, record: RunStep) -> None:
        self.pending.steps.append(record)

    def progress(self, *, wake: datetime | None = None) -> runs_store.Progress:
        """What is pending, with the run's progress (still ``running``), as one write;
        released until ``wake`` when given."""
        values = {
            **self.pending.values,
            "next_step": self.idx,
            "steps_executed": self.run.steps_executed,
            **(released(wake) if wake is not None else {}),
        }
        change = runs_store.StatusChange(RunStatus.RUNNING, values)
        return runs_store.Progress(
            self.run.run_id, (change,), self.pending.steps, self.pending.events
        )

    async def apply(self, progress: runs_store.Progress) -> None:
        if not await self.writer.apply(progress):
            raise runs_store.LeaseLost(self.run.run_id)

    async def apply_in(self, conn: AsyncConnection, progress: runs_store.Progress) -> None:
        [ok] = await runs_store.apply_progress(conn, [progress], owner=self.writer.owner)
        if not ok:
            raise runs_store.LeaseLost(self.run.run_id)

    def written(self) -> None:
        self.pending = Pending()
        self.run.status = RunStatus.RUNNING

    async def commit(self, *, wake: datetime | None = None) -> None:
        """Commit what is pending with the run's progress (still ``running``); a refused
        write keeps what it held for a cancel (:meth:`RunWriter.lost`)."""
        if not await self.writer.apply(self.progress(wake=wake)):
            raise self.writer.lost(self.run, self.pending.steps, self.pending.events)
        self.written()

    async def sleep_until(self, wake: datetime) -> RunStatus:
        """Give the run back until ``wake`` (a delay, a wait, a retry's backoff): no lease,
        and the lost-worker count starts again."""
        await self.commit(wake=wake)
        return RunStatus.RUNNING

    # -- step results ----------------------------------------------------------------------

    def record(self, record: RunStep) -> None:
        """A step's final record (completed or failed), its event, and what later steps see
        of it."""
        metrics.step_seconds(record.type, str(record.status)).observe(
            (record.duration_ms or 0) / 1000
        )
        self.pending.steps.append(record)
        self.pending.events.append(self.step_event(record, will_retry=False))
        self.ctx["steps"][record.step_id] = {"output": record.output, "status": str(record.status)}
        self.run.steps_executed += 1

    def skip(self, step: Step) -> None:
        """Record ``step`` skipped by a ``goto`` past it."""
        self.pending.steps.append(
            RunStep(
                idx=self.idx,
                step_id=step.id,
                type=step.type,
                status=StepStatus.SKIPPED,
                attempts=0,
            )
        )
        self.ctx["steps"][step.id] = {"output": None, "status": "skipped"}
        self.idx += 1

    async def done(
        self, step: Step, record: RunStep, outcome: Outcome, *, durable: bool = False
    ) -> RunStatus | None:
        self.record(record)
        self.idx += 1
        return await self.go_on(step, outcome, durable=durable)

    async def failed(self, attempt: Attempt, type_: str, message: str) -> RunStatus | None:
        outcome = failure(type_, message)
        record = attempt.record(StepStatus.FAILED, self.now(), outcome)
        return await self.done(attempt.step, record, outcome)

    async def go_on(
        self, step: Step, outcome: Outcome, *, durable: bool = False
    ) -> RunStatus | None:
        """After a step's result: follow its ``action`` (fail, end, goto, continue) and commit
        the result of a step that is not pure, unless the next step's start will carry it or
        the result is ``durable`` already (stored where a resumed run finds it again)."""
        if outcome.action == Action.FAIL:
            error = dict(outcome.error or {"type": "fail", "message": "step failed"})
            error["step"] = step.id
            return await self.finish(RunStatus.FAILED, error=error)
        if outcome.action == Action.END:
            self.ended = True
            return None
        if outcome.action == Action.GOTO:
            self.skip_to = outcome.target
        steps = self.flow.steps
        following = steps[self.idx] if self.idx < len(steps) else None
        carried = self.skip_to is None and following is not None and following.external
        if not step.pure and not durable and not carried:
            await self.commit()
        # else the commit that records the next step's start records this result too
        return None

    def step_event(self, step: RunStep, *, will_retry: bool) -> Event:
        now = step.finished_at or self.now()
        run = self.run
        payload: dict[str, Any] = {
            "step_id": step.step_id,
            "type": step.type,
            "attempt": step.attempts,
            "duration_ms": step.duration_ms,
        }
        if run.root_run_id is not None:  # a part's step: an event of the run it is part of
            payload.update(nesting(run.scope or {}))
            run = replace(run, run_id=run.root_run_id)
        if step.error is not None:
            payload["error"] = step.error
            payload["will_retry"] = will_retry
            return run_event(run, "flow.step_failed", payload, now)
        payload["output"] = step.output
        return run_event(run, "flow.step_completed", payload, now)

    # -- the end ---------------------------------------------------------------------------

    async def finish(
        self, status: RunStatus, *, output: Any = None, error: dict[str, Any] | None = None
    ) -> RunStatus:
        """End the run ``completed`` or ``failed`` at this step, with what is pending."""
        return await self.writer.finish(
            self.run, self.pending, status, next_step=self.idx, output=output, error=error
        )

    async def timed_out(self, step_id: str) -> RunStatus:
        timeout = self.flow.timeout
        error = {"type": "timeout", "message": f"run exceeded {timeout:g} s", "step": step_id}
        return await self.finish(RunStatus.FAILED, error=error)


def nesting(scope: dict[str, Any]) -> dict[str, Any]:
    """Where a part's step sits: ``parent`` (the ``parallel`` or ``map`` step) and ``branch``
    or ``index``."""
    where: dict[str, Any] = {"parent": scope.get("step")}
    if "branch" in scope:
        where["branch"] = scope["branch"]
    if "index" in scope:
        where["index"] = scope["index"]
    return where
