"""Runs one claimed run, step by step, from its first unfinished step: the loop.

Pure steps (``transform``, ``condition``, ``fail``) are collected and committed together with
their events and the run's progress in one transaction: running them again after a crash
gives the same result, so nothing is lost by committing late. Before any other step what is
pending is committed, and the step's result is committed right after it, so a finished step
never runs twice. Every commit is guarded by the lease, so a worker that lost its run cannot
overwrite the one that took over.

A step with effects outside (``http``, ``python``) has its attempt's start recorded (step
status ``running``) in the commit before it; when the next step is such a step too, the
result of the one before rides in that same commit. A crash mid-attempt leaves the
``running`` record behind: the next worker runs the step again as the next attempt and
lists the one cut short in the step's ``interrupted``. Interrupted attempts do not use up
the step's ``retry`` budget. A run that ends while such an attempt is open (cancelled, timed
out, lost its worker too often) records the step failed.

A retry's backoff releases the run: it is written back with ``available_at`` at its wake-up
time and no lease, and any worker claims it then. A step that suspends its run (``delay``,
``wait``, ``approval``, ``flow``, ``parallel``, ``map``) does the same through its own
durable half (:mod:`flowhook.engine.durable`): the loop has no branch per step type.

The pieces: :mod:`~flowhook.engine.cursor` (a run's pending writes and how they are
committed), :mod:`~flowhook.engine.writer` (the guarded writes and a run's end),
:mod:`~flowhook.engine.compiled` (flow versions), :mod:`~flowhook.engine.admission` (flow
control at the start), :mod:`~flowhook.engine.parts` (what parts see).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import aiohttp

from flowhook import tracing
from flowhook.clock import Clock
from flowhook.definition import ExpressionError, evaluate
from flowhook.engine import spans
from flowhook.engine.admission import Admission
from flowhook.engine.compiled import DEFAULT_RUN_TIMEOUT, CompiledFlow, FlowCache
from flowhook.engine.cursor import Pending, RunCursor
from flowhook.engine.durable import (
    Attempt,
    Suspending,
    check_output,
    next_attempt,
    output_problem,
)
from flowhook.engine.parts import Scopes, context, see_branches
from flowhook.engine.retry import backoff_seconds
from flowhook.engine.steps import Outcome, Step, StepEnv
from flowhook.engine.steps.base import Action
from flowhook.engine.steps.base import error as failure
from flowhook.engine.writer import RunWriter
from flowhook.store import control as control_store
from flowhook.store import runs as runs_store
from flowhook.store import step_secrets
from flowhook.store.db import Database
from flowhook.store.models import Held, Run, RunStatus, RunStep, StepStatus

__all__ = ["Executor", "CompiledFlow", "DEFAULT_RUN_TIMEOUT", "DEFAULT_MAX_OUTPUT_BYTES"]

log = logging.getLogger("flowhook.engine")
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024


class Executor:
    """Runs a claimed run in stages: :meth:`_resume` (pick it up where it stopped),
    :meth:`_next_step` (skip, wake or attempt one step), :meth:`_attempt` (the step itself,
    within its timeouts), :meth:`_settle` (record the outcome: suspend, retry, go on, fail,
    end, goto) and :meth:`_complete` (the flow's output) or the writer's end of the run."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        owner: str,
        *,
        http: aiohttp.ClientSession | None = None,
        allow_private_targets: bool = False,
        max_claims: int = 5,
        cache_size: int = 1024,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_map_items: int = 1000,
        max_run_tree: int = 10_000,
        apply: Callable[[runs_store.Progress], Awaitable[bool]] | None = None,
        public_url: str = "http://127.0.0.1:8080",
    ) -> None:
        self._db = db
        self._owner = owner
        self._clock = clock
        self._http = http
        self._allow_private = allow_private_targets
        self._max_claims = max_claims
        self._max_map_items = max_map_items
        self.flows = FlowCache(db, cache_size)
        self.writer = RunWriter(
            db, clock, owner, self.flows, apply=apply, max_output=max_output_bytes,
            max_run_tree=max_run_tree, public_url=public_url,
        )  # fmt: skip
        self._admission = Admission(clock, owner, self.flows, self.writer.apply)
        self._scopes = Scopes(db)
        self.in_step: set[str] = set()
        """Runs whose step is in flight now: the ones a cancel may interrupt."""
        self.cancelling: set[str] = set()
        """Runs whose task the worker cancelled because a cancel was requested."""

    async def execute(self, run: Run, *, paused: bool = False) -> RunStatus | None:
        """Run ``run`` until it ends or sleeps; the status it is left in, or ``None`` when its
        lease was lost to another worker. ``paused``: its flow is paused, so a run that has
        not started is handed back held until the flow's resume."""
        try:
            if paused and run.status is RunStatus.QUEUED:
                return await self._hold_paused(run)
            return await self._execute(run)
        except runs_store.LeaseLost:
            return await self._after_guard_failed(run)
        except asyncio.CancelledError:
            if run.run_id not in self.cancelling:
                raise  # shutting down: the lease runs out and another worker resumes the run
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return await self._after_guard_failed(run)
        finally:
            self.in_step.discard(run.run_id)
            self.cancelling.discard(run.run_id)
            self.writer.forget(run.run_id)

    async def _execute(self, run: Run) -> RunStatus:
        cur = await self._resume(run)
        if not isinstance(cur, RunCursor):
            return cur
        while cur.idx < len(cur.flow.steps) and not cur.ended:
            stopped = await self._next_step(cur)
            if stopped is not None:
                return stopped
        return await self._complete(cur)

    # -- resume: pick the run up where it stopped ------------------------------------------

    async def _resume(self, run: Run) -> RunCursor | RunStatus:
        """The run ready for its next step; or the status it is left in when it goes no
        further now (cancelled, held back by its flow's concurrency, failed before a step)."""
        if run.cancel_requested_at is not None:
            if run.status is RunStatus.RUNNING:
                await self._load_earlier(run)
            return await self.writer.cancel(run)
        compiled = await self.flows.get(run.flow_id, run.flow_version)
        if run.root_run_id is not None:
            return await self._resume_part(run, compiled)
        resumed = run.status is RunStatus.RUNNING  # else what earlier claims recorded
        pending = Pending()
        control = None if compiled is None else compiled.control
        if control is not None and control.admits and not resumed:
            if not await self._admission.admit(run, control):
                return run.status
        elif not resumed:
            pending.start(run, self._clock.now())
        # a resumed run, or a rerun that starts after the steps it reuses
        earlier = await self._load_earlier(run) if resumed or run.next_step else {}
        stopped = await self._cannot_go_on(run, pending, compiled, "run")
        if stopped is not None:
            return stopped
        assert compiled is not None
        assert run.started_at is not None
        ctx = context(run, earlier)
        await see_branches(self._db, run, earlier, ctx)
        deadline = run.started_at + timedelta(seconds=compiled.timeout)
        return RunCursor(self.writer, run, compiled, earlier, ctx, deadline, run.next_step, pending)

    async def _hold_paused(self, run: Run) -> RunStatus:
        """Hand a queued run of a paused flow back, held until the flow's resume."""
        async with self._db.transaction() as conn:
            held = await control_store.hold(
                conn, run.run_id, owner=self._owner, reason=Held.PAUSED.value
            )
        if not held:
            raise runs_store.LeaseLost(run.run_id)
        return RunStatus.QUEUED

    async def _resume_part(self, run: Run, compiled: CompiledFlow | None) -> RunCursor | RunStatus:
        """A part (a branch of a ``parallel``, an item of a ``map``) ready for its next step:
        it runs its list of steps, seeing what its run saw when the step started the parts,
        and its own ``item`` and ``index`` in a map; the run's timeout bounds it. It raises no
        run events and counts against no cap."""
        pending = Pending()
        if run.status is RunStatus.QUEUED:
            run.started_at = pending.values["started_at"] = self._clock.now()
        earlier = await self._load_earlier(run) if run.status is RunStatus.RUNNING else {}
        flow = compiled.part(run.scope or {}) if compiled is not None else None
        stopped = await self._cannot_go_on(run, pending, flow, "part")
        if stopped is not None:
            return stopped
        assert flow is not None
        scope = await self._scopes.part_context(run, earlier)
        if scope is None:
            missing = {"type": "definition", "message": "the steps of this part are missing"}
            return await self.writer.finish(run, pending, RunStatus.FAILED, error=missing)
        ctx, root_started = scope
        await see_branches(self._db, run, earlier, ctx)
        deadline = root_started + timedelta(seconds=flow.timeout)
        return RunCursor(self.writer, run, flow, earlier, ctx, deadline, run.next_step, pending)

    async def _cannot_go_on(
        self, run: Run, pending: Pending, flow: CompiledFlow | None, what: str
    ) -> RunStatus | None:
        """End a run (or a part) that lost its worker too often in a row, or whose steps are
        missing; ``None`` when it may go on."""
        if run.claims > self._max_claims:
            lost = {
                "type": "worker_lost",
                "message": f"the {what} lost its worker {run.claims - 1} times in a row",
                "step": None,
            }
            return await self.writer.finish(run, pending, RunStatus.FAILED, error=lost)
        if flow is None:
            message = (
                "the flow version of this run is missing" if what == "run"
                else "the steps of this part are missing"
            )  # fmt: skip
            missing = {"type": "definition", "message": message}
            return await self.writer.finish(run, pending, RunStatus.FAILED, error=missing)
        return None

    async def _load_earlier(self, run: Run) -> dict[int, RunStep]:
        """The step records of a resumed run, by index; notes a ``running`` one, which a
        crash cut short."""
        async with self._db.read() as conn:
            steps = await runs_store.steps_of(conn, run.run_id)
        earlier = {s.idx: s for s in steps}
        for s in earlier.values():
            if s.status is StepStatus.RUNNING:
                self.writer.open[run.run_id] = (s, True)
        return earlier

    # -- one step ------------------------------------------------------------------------

    async def _next_step(self, cur: RunCursor) -> RunStatus | None:
        """Skip, wake or attempt the step at ``cur.idx``; the status the run is left in when
        it stops here (ended, or asleep until a wake-up), else ``None``."""
        step = cur.flow.steps[cur.idx]
        if cur.skip_to is not None and step.id != cur.skip_to:
            cur.skip(step)
            return None
        cur.skip_to = None
        now = self._clock.now()
        if now >= cur.deadline:
            return await cur.timed_out(step.id)
        prior = cur.earlier.get(cur.idx)
        if prior is not None and prior.status is StepStatus.WAITING:
            # the run slept in the step: the step's durable half wakes it
            assert isinstance(step, Suspending), step.type
            return await step.wake(cur, prior, now)
        attempt = await self._begin(cur, step, prior, now)
        outcome = await self._attempt(cur, attempt)
        if outcome is None:
            return await cur.timed_out(step.id)
        return await self._settle(cur, attempt, outcome)

    async def _begin(
        self, cur: RunCursor, step: Step, prior: RunStep | None, now: datetime
    ) -> Attempt:
        """Before an attempt: a step with effects outside has its start (``running``)
        committed with what is pending; any other step that is not pure commits what is
        pending."""
        number, interrupted = next_attempt(prior)
        if step.external:
            marker = RunStep(
                idx=cur.idx,
                step_id=step.id,
                type=step.type,
                status=StepStatus.RUNNING,
                attempts=number,
                started_at=now,
                interrupted=interrupted,
            )
            cur.add(marker)
            await cur.commit()
            self.writer.open[cur.run.run_id] = (marker, False)
        elif not step.pure and cur.pending:
            await cur.commit()
        return Attempt(step, cur.idx, number, interrupted, self._clock.now())

    async def _attempt(self, cur: RunCursor, attempt: Attempt) -> Outcome | None:
        """Run the step within its own timeout and what is left of the run's; its outcome (a
        step that raises or overruns its timeout fails), or ``None`` when the run's time is
        up."""
        run, step = cur.run, attempt.step
        run_left = (cur.deadline - attempt.started).total_seconds()
        limit = min(step.timeout or run_left, run_left)
        env = StepEnv(
            self._clock, self._http, self._allow_private, run.root_run_id or run.run_id,
            run.flow_id, attempt.number, self._max_map_items, run.run_id, attempt.idx,
            run.traceparent, {} if tracing.ENABLED else None, self._secrets_of(run),
        )  # fmt: skip
        self.in_step.add(run.run_id)
        outcome: Outcome | None = None
        try:
            async with asyncio.timeout(limit):
                outcome = await step.run(cur.ctx, env)
        except TimeoutError:
            if step.timeout is not None and run_left > step.timeout:
                outcome = failure("timeout", f"step took longer than {step.timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - a step that raises fails that step only
            log.warning("run %s: step %s raised %s", run.run_id, step.id, type(exc).__name__)
            outcome = failure("internal", f"{type(exc).__name__}: {exc}")
        finally:
            self.in_step.discard(run.run_id)
            if env.span is not None:
                spans.step_span(
                    run, step, attempt.idx, attempt.number, attempt.started, self._clock.now(),
                    outcome, env.span,
                )  # fmt: skip
        if outcome is None:
            return None
        self.writer.open.pop(run.run_id, None)
        check_output(outcome, self.writer.max_output)
        return outcome

    def _secrets_of(self, run: Run) -> Callable[[frozenset[str]], Awaitable[dict[str, str]]]:
        """What reads the step secrets of the run's workspace and mode, when a step asks."""

        async def read(names: frozenset[str]) -> dict[str, str]:
            async with self._db.read() as conn:
                return await step_secrets.values_of(conn, run.workspace_id, run.mode, names)

        return read

    async def _settle(self, cur: RunCursor, attempt: Attempt, outcome: Outcome) -> RunStatus | None:
        """Record the attempt's outcome: the run sleeps (the step suspends it, a retry's
        backoff), fails, or goes on."""
        step = attempt.step
        if outcome.action == Action.SUSPEND:
            assert isinstance(step, Suspending), step.type
            return await step.park(cur, attempt, outcome)
        finished = self._clock.now()
        if outcome.error is not None:
            # an interrupted attempt does not use up the retry budget
            delay = backoff_seconds(step.retry, attempt.number - len(attempt.interrupted))
            if delay is not None:
                record = attempt.record(StepStatus.RETRYING, finished, outcome)
                cur.pending.events.append(cur.step_event(record, will_retry=True))
                cur.add(record)
                wake = min(finished + timedelta(seconds=delay), cur.deadline)
                return await cur.sleep_until(wake)
        status = StepStatus.FAILED if outcome.error else StepStatus.COMPLETED
        return await cur.done(step, attempt.record(status, finished, outcome), outcome)

    # -- the end -------------------------------------------------------------------------

    async def _complete(self, cur: RunCursor) -> RunStatus:
        """No step is left (or one ended the run): the flow's output, and the run completes;
        it fails when that output cannot be evaluated or stored."""
        output = None
        if cur.run.root_run_id is not None:  # a part: the output of its last step that ran
            for step in reversed(cur.flow.steps):
                seen = cur.ctx["steps"].get(step.id)
                if seen is not None and seen["status"] == "completed":
                    output = seen["output"]
                    break
        elif cur.flow.output is not None:
            try:
                output = await evaluate(cur.flow.output, cur.ctx)
                problem = output_problem(output, self.writer.max_output)
            except ExpressionError as exc:
                problem = str(exc)
            if problem is not None:
                error = {"type": "expression", "message": f"flow output: {problem}", "step": None}
                return await cur.finish(RunStatus.FAILED, error=error)
        return await cur.finish(RunStatus.COMPLETED, output=output)

    async def _after_guard_failed(self, run: Run) -> RunStatus | None:
        async with self._db.read() as conn:
            current = await runs_store.get_run_by_id(conn, run.run_id)
        if current is None or current.status.terminal:
            return None
        if current.cancel_requested_at is not None:
            try:
                return await self.writer.cancel(current)
            except runs_store.LeaseLost:
                return None
        log.info("run %s: lease lost to another worker", run.run_id)
        return None
