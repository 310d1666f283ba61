"""Runs one claimed run, step by step, from its first unfinished step.

Pure steps (``transform``, ``condition``, ``fail``) are collected and committed together with
their events and the run's progress in one transaction: running them again after a crash
gives the same result, so nothing is lost by committing late. Before any other step
(``http``, ``python``, ``delay``) what is pending is committed, and the step's result is
committed right after it, so a finished step never runs twice. Every commit is guarded by
the lease, so a worker that lost its run cannot overwrite the one that took over.

A step with effects outside (``http``, ``python``) has its attempt's start recorded (step
status ``running``) in the commit before it; when the next step is such a step too, the
result of the one before rides in that same commit. A crash mid-attempt leaves the
``running`` record behind: the next worker runs the step again as the next attempt and
lists the one cut short in the step's ``interrupted``. Interrupted attempts do not use up
the step's ``retry`` budget. A run that ends while such an attempt is open (cancelled, timed
out, lost its worker too often) records the step failed.

A delay or a retry backoff releases the run: it is written back with ``available_at`` at its
wake-up time and no lease, and any worker claims it then.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import orjson

from flowhook.clock import Clock
from flowhook.definition import ExpressionError, Renderer, compile_value, evaluate
from flowhook.definition.sandbox import weight
from flowhook.engine import metrics
from flowhook.engine.retry import backoff_seconds
from flowhook.engine.steps import Context, Outcome, Step, StepEnv, build_step
from flowhook.events import make_event
from flowhook.store import flows as flows_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Event, Run, RunStatus, RunStep, StepStatus
from flowhook.store.types import json_has_nul

__all__ = ["Executor", "CompiledFlow", "DEFAULT_RUN_TIMEOUT", "DEFAULT_MAX_OUTPUT_BYTES"]

log = logging.getLogger("flowhook.engine")
DEFAULT_RUN_TIMEOUT = 3600.0
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024
FLOW_CAP_RETRY = timedelta(milliseconds=200)
"""How soon a run held back by its flow's ``concurrency`` is tried again."""


@dataclass(slots=True)
class CompiledFlow:
    steps: list[Step]
    output: Renderer | None
    timeout: float
    concurrency: int | None

    @classmethod
    def build(cls, definition: dict[str, Any]) -> CompiledFlow:
        steps = [build_step(spec) for spec in definition["steps"]]
        output = compile_value(definition["output"]) if "output" in definition else None
        timeout = float(definition.get("timeout_seconds", DEFAULT_RUN_TIMEOUT))
        return cls(steps, output, timeout, definition.get("concurrency"))


@dataclass(slots=True)
class _Pending:
    """Writes not yet committed: step rows, events and the run's new values."""

    steps: list[RunStep] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.steps or self.events or self.values)


def _ms(start: datetime, end: datetime) -> int:
    return max(0, round((end - start).total_seconds() * 1000))


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class Executor:
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
        apply: Callable[[runs_store.Progress], Awaitable[bool]] | None = None,
    ) -> None:
        self._apply = apply or self._apply_alone
        self._db = db
        self._clock = clock
        self._owner = owner
        self._http = http
        self._allow_private = allow_private_targets
        self._max_claims = max_claims
        self._max_output = max_output_bytes
        self._flows: OrderedDict[tuple[str, int], CompiledFlow] = OrderedDict()
        self._cache_size = cache_size
        self.in_step: set[str] = set()
        """Runs whose step is in flight now: the ones a cancel may interrupt."""
        self.cancelling: set[str] = set()
        """Runs whose task the worker cancelled because a cancel was requested."""
        self._open: dict[str, tuple[RunStep, bool]] = {}
        """Per run: its step whose ``running`` record is committed and has no outcome yet, and
        whether a crash already cut that attempt short (found so on a resumed run)."""

    async def _apply_alone(self, progress: runs_store.Progress) -> bool:
        async with self._db.transaction() as conn:
            [ok] = await runs_store.apply_progress(conn, [progress], owner=self._owner)
        return ok

    async def _write(
        self,
        run: Run,
        changes: tuple[tuple[RunStatus, dict[str, Any], bool], ...],
        steps: list[RunStep],
        events: list[Event],
    ) -> None:
        """Write a run's progress (possibly in a transaction shared with other runs); raises
        LeaseLost when the run's guard fails."""
        if not await self._apply(runs_store.Progress(run.run_id, changes, steps, events)):
            raise runs_store.LeaseLost(run.run_id)

    async def _compiled(self, run: Run) -> CompiledFlow | None:
        key = (run.flow_id, run.flow_version)
        compiled = self._flows.get(key)
        if compiled is None:
            async with self._db.read() as conn:
                definition = await flows_store.get_definition(conn, *key)
            if definition is None:
                return None
            compiled = CompiledFlow.build(definition)
            self._flows[key] = compiled
            if len(self._flows) > self._cache_size:
                self._flows.popitem(last=False)
        else:
            self._flows.move_to_end(key)
        return compiled

    def _event(self, run: Run, type_: str, payload: dict[str, Any], now: datetime) -> Event:
        return make_event(
            type_,
            workspace_id=run.workspace_id,
            mode=run.mode,
            flow_id=run.flow_id,
            run_id=run.run_id,
            payload=payload,
            now=now,
        )

    async def execute(self, run: Run) -> RunStatus | None:
        """Run ``run`` until it ends or sleeps; the status it is left in, or ``None`` when its
        lease was lost to another worker."""
        try:
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
            self._open.pop(run.run_id, None)

    async def _execute(self, run: Run) -> RunStatus | None:
        if run.cancel_requested_at is not None:
            if run.status is RunStatus.RUNNING:
                await self._load_earlier(run)
            return await self._cancel(run)
        compiled = await self._compiled(run)
        if compiled is not None and compiled.concurrency is not None:
            now = self._clock.now()
            async with self._db.read() as conn:
                ahead = await runs_store.count_older_in_flight(conn, run, now)
            if ahead >= compiled.concurrency:
                async with self._db.transaction() as conn:
                    await runs_store.defer(
                        conn, run.run_id, owner=self._owner, until=now + FLOW_CAP_RETRY
                    )
                return run.status
        # resumed: what earlier claims recorded
        earlier = await self._load_earlier(run) if run.status is RunStatus.RUNNING else {}
        pending = _Pending()
        now = self._clock.now()
        if run.status is RunStatus.QUEUED:
            run.started_at = now
            pending.values["started_at"] = now
            metrics.START_LATENCY.observe(max(0.0, (now - run.queued_at).total_seconds()))
            pending.events.append(
                self._event(
                    run,
                    "flow.started",
                    {"status": "running", "trigger": run.trigger, "flow_version": run.flow_version},
                    now,
                )
            )
        if run.claims > self._max_claims:
            lost = {
                "type": "worker_lost",
                "message": f"the run lost its worker {run.claims - 1} times in a row",
                "step": None,
            }
            return await self._finish(run, pending, RunStatus.FAILED, error=lost)
        if compiled is None:
            missing = {"type": "definition", "message": "the flow version of this run is missing"}
            return await self._finish(run, pending, RunStatus.FAILED, error=missing)
        assert run.started_at is not None
        deadline = run.started_at + timedelta(seconds=compiled.timeout)

        ctx: Context = {
            "payload": run.payload,
            "steps": {},
            "run": {"id": run.run_id, "flow_id": run.flow_id, "trigger": run.trigger},
        }
        for s in earlier.values():
            if s.status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
                ctx["steps"][s.step_id] = {"output": s.output, "status": str(s.status)}

        idx = run.next_step
        skip_to: str | None = None
        while idx < len(compiled.steps):
            step = compiled.steps[idx]
            if skip_to is not None and step.id != skip_to:
                pending.steps.append(RunStep(idx, step.id, step.type, StepStatus.SKIPPED, 0))
                ctx["steps"][step.id] = {"output": None, "status": "skipped"}
                idx += 1
                continue
            skip_to = None
            now = self._clock.now()
            if now >= deadline:
                return await self._timed_out(run, pending, idx, step.id, compiled.timeout)
            prior = earlier.get(idx)
            if prior is not None and prior.status is StepStatus.WAITING:
                until = _parse_time(prior.output["until"])
                if now < until:
                    return await self._release(run, pending, idx, min(until, deadline))
                record = RunStep(
                    idx,
                    step.id,
                    step.type,
                    StepStatus.COMPLETED,
                    prior.attempts,
                    prior.started_at,
                    now,
                    _ms(prior.started_at or now, now),
                    prior.output,
                )
                self._record(run, pending, ctx, record, will_retry=False)
                idx += 1
                continue
            attempt, interrupted = _next_attempt(prior)
            if step.external:
                marker = RunStep(idx, step.id, step.type, StepStatus.RUNNING, attempt, now)
                marker.interrupted = interrupted
                await self._begin(run, pending, marker)
                pending = _Pending()
            elif not step.pure and pending:
                await self._commit(run, pending, idx)
                pending = _Pending()

            started = self._clock.now()
            run_left = (deadline - started).total_seconds()
            limit = min(step.timeout or run_left, run_left)
            env = StepEnv(
                self._clock, self._http, self._allow_private, run.run_id, run.flow_id, attempt
            )
            self.in_step.add(run.run_id)
            try:
                async with asyncio.timeout(limit):
                    outcome = await step.run(ctx, env)
            except TimeoutError:
                if step.timeout is None or run_left <= step.timeout:
                    return await self._timed_out(run, pending, idx, step.id, compiled.timeout)
                outcome = Outcome(
                    error={
                        "type": "timeout",
                        "message": f"step took longer than {step.timeout:g} s",
                    },
                    action="fail",
                )
            except Exception as exc:  # noqa: BLE001 - a step that raises fails that step only
                log.warning("run %s: step %s raised %s", run.run_id, step.id, type(exc).__name__)
                outcome = Outcome(
                    error={"type": "internal", "message": f"{type(exc).__name__}: {exc}"},
                    action="fail",
                )
            finally:
                self.in_step.discard(run.run_id)
            self._open.pop(run.run_id, None)
            _check_output(outcome, self._max_output)
            finished = self._clock.now()

            if outcome.action == "wait" and outcome.wait_until is not None:
                record = RunStep(
                    idx,
                    step.id,
                    step.type,
                    StepStatus.WAITING,
                    attempt,
                    started,
                    None,
                    None,
                    outcome.output,
                )
                pending.steps.append(record)
                return await self._release(run, pending, idx, min(outcome.wait_until, deadline))

            if outcome.error is not None:
                # an interrupted attempt does not use up the retry budget
                delay = backoff_seconds(step.retry, attempt - len(interrupted))
                if delay is not None:
                    record = RunStep(
                        idx,
                        step.id,
                        step.type,
                        StepStatus.RETRYING,
                        attempt,
                        started,
                        finished,
                        _ms(started, finished),
                        outcome.output,
                        outcome.error,
                        interrupted,
                    )
                    pending.events.append(self._step_event(run, record, finished, will_retry=True))
                    pending.steps.append(record)
                    wake = min(finished + timedelta(seconds=delay), deadline)
                    return await self._release(run, pending, idx, wake)

            record = RunStep(
                idx=idx,
                step_id=step.id,
                type=step.type,
                status=StepStatus.FAILED if outcome.error else StepStatus.COMPLETED,
                attempts=attempt,
                started_at=started,
                finished_at=finished,
                duration_ms=_ms(started, finished),
                output=outcome.output,
                error=outcome.error,
                interrupted=interrupted,
            )
            self._record(run, pending, ctx, record, will_retry=False)
            idx += 1
            if outcome.action == "fail":
                error = dict(outcome.error or {"type": "fail", "message": "step failed"})
                error["step"] = step.id
                return await self._finish(
                    run, pending, RunStatus.FAILED, next_step=idx, error=error
                )
            if outcome.action == "end":
                break
            if outcome.action == "goto":
                skip_to = outcome.target
            following = compiled.steps[idx] if idx < len(compiled.steps) else None
            if not step.pure and not (skip_to is None and following and following.external):
                await self._commit(run, pending, idx)
                pending = _Pending()
            # else the commit that records the next step's start records this result too

        output = None
        if compiled.output is not None:
            try:
                output = await evaluate(compiled.output, ctx)
                problem = _output_problem(output, self._max_output)
            except ExpressionError as exc:
                problem = str(exc)
            if problem is not None:
                failure = {"type": "expression", "message": f"flow output: {problem}", "step": None}
                return await self._finish(
                    run, pending, RunStatus.FAILED, next_step=idx, error=failure
                )
        return await self._finish(run, pending, RunStatus.COMPLETED, next_step=idx, output=output)

    def _record(
        self, run: Run, pending: _Pending, ctx: Context, record: RunStep, *, will_retry: bool
    ) -> None:
        metrics.STEP_SECONDS.labels(type=record.type, status=str(record.status)).observe(
            (record.duration_ms or 0) / 1000
        )
        pending.steps.append(record)
        pending.events.append(
            self._step_event(
                run, record, record.finished_at or self._clock.now(), will_retry=will_retry
            )
        )
        ctx["steps"][record.step_id] = {"output": record.output, "status": str(record.status)}
        run.steps_executed += 1

    def _step_event(self, run: Run, step: RunStep, now: datetime, *, will_retry: bool) -> Event:
        payload: dict[str, Any] = {
            "step_id": step.step_id,
            "type": step.type,
            "attempt": step.attempts,
            "duration_ms": step.duration_ms,
        }
        if step.error is not None:
            payload["error"] = step.error
            payload["will_retry"] = will_retry
            return self._event(run, "flow.step_failed", payload, now)
        payload["output"] = step.output
        return self._event(run, "flow.step_completed", payload, now)

    async def _load_earlier(self, run: Run) -> dict[int, RunStep]:
        """The step records of a resumed run, by index; notes a ``running`` one, which a
        crash cut short."""
        async with self._db.read() as conn:
            done = await runs_store.get_run_by_id(conn, run.run_id)
        earlier = {s.idx: s for s in done.steps} if done else {}
        for s in earlier.values():
            if s.status is StepStatus.RUNNING:
                self._open[run.run_id] = (s, True)
        return earlier

    async def _begin(self, run: Run, pending: _Pending, marker: RunStep) -> None:
        """Commit what is pending with the start of an external step's attempt (``marker``,
        status ``running``), before the attempt runs."""
        pending.steps.append(marker)
        await self._commit(run, pending, marker.idx)
        self._open[run.run_id] = (marker, False)

    def _close_open(
        self, run: Run, pending: _Pending, now: datetime, error: dict[str, Any] | None, *, cut: bool
    ) -> None:
        """The run ends while a step's attempt has no outcome (its record says ``running``):
        record that step failed with ``error``. The attempt counts as interrupted when ``cut``
        or when a crash cut it."""
        found = self._open.pop(run.run_id, None)
        if found is None:  # e.g. the run as read after its result's write lost to a cancel
            left = [s for s in run.steps if s.status is StepStatus.RUNNING]
            found = (left[0], True) if left else None
        if found is None or any(s.idx == found[0].idx for s in pending.steps):
            return
        step, crashed = found
        started = step.started_at or now
        pending.steps.append(
            RunStep(
                step.idx,
                step.step_id,
                step.type,
                StepStatus.FAILED,
                step.attempts,
                started,
                now,
                _ms(started, now),
                None,
                {k: v for k, v in (error or {}).items() if k != "step"} or None,
                (*step.interrupted, step.attempts) if cut or crashed else step.interrupted,
            )
        )

    async def _commit(self, run: Run, pending: _Pending, next_step: int, **extra: Any) -> None:
        values = {
            **pending.values,
            "next_step": next_step,
            "steps_executed": run.steps_executed,
            **extra,
        }
        await self._write(run, ((RunStatus.RUNNING, values, True),), pending.steps, pending.events)
        run.status = RunStatus.RUNNING

    async def _release(self, run: Run, pending: _Pending, idx: int, wake: datetime) -> RunStatus:
        """Give the run back until ``wake`` (a delay or a retry backoff): no lease, and the
        lost-worker count starts again."""
        await self._commit(
            run,
            pending,
            idx,
            available_at=wake,
            due_at=wake,
            lease_owner=None,
            lease_expires_at=None,
            claims=0,
        )
        return RunStatus.RUNNING

    async def _timed_out(
        self, run: Run, pending: _Pending, idx: int, step_id: str, timeout: float
    ) -> RunStatus:
        error = {"type": "timeout", "message": f"run exceeded {timeout:g} s", "step": step_id}
        return await self._finish(run, pending, RunStatus.FAILED, next_step=idx, error=error)

    async def _finish(
        self,
        run: Run,
        pending: _Pending,
        status: RunStatus,
        *,
        next_step: int | None = None,
        output: Any = None,
        error: dict[str, Any] | None = None,
    ) -> RunStatus:
        now = self._clock.now()
        duration = _ms(run.started_at or now, now)
        self._close_open(run, pending, now, error, cut=False)
        values: dict[str, Any] = {
            **pending.values,
            "steps_executed": run.steps_executed,
            "finished_at": now,
            "duration_ms": duration,
            "output": output,
            "error": error,
        }
        if next_step is not None:
            values["next_step"] = next_step
        if status is RunStatus.COMPLETED:
            payload = {
                **(output if isinstance(output, dict) else {}),
                "status": "completed",
                "steps_executed": run.steps_executed,
                "duration_ms": duration,
            }
            pending.events.append(self._event(run, "flow.completed", payload, now))
        else:
            payload = {
                "status": "failed",
                "error": error,
                "steps_executed": run.steps_executed,
                "duration_ms": duration,
            }
            pending.events.append(self._event(run, "flow.failed", payload, now))
        changes: tuple[tuple[RunStatus, dict[str, Any], bool], ...] = ((status, values, True),)
        if run.status is RunStatus.QUEUED:  # started and finished in one commit
            changes = ((RunStatus.RUNNING, {}, True), *changes)
        await self._write(run, changes, pending.steps, pending.events)
        metrics.RUNS_FINISHED.labels(status=str(status)).inc()
        run.status = status
        return status

    async def _after_guard_failed(self, run: Run) -> RunStatus | None:
        async with self._db.read() as conn:
            current = await runs_store.get_run_by_id(conn, run.run_id)
        if current is None or current.status.terminal:
            return None
        if current.cancel_requested_at is not None:
            try:
                return await self._cancel(current)
            except runs_store.LeaseLost:
                return None
        log.info("run %s: lease lost to another worker", run.run_id)
        return None

    async def _cancel(self, run: Run) -> RunStatus:
        now = self._clock.now()
        duration = _ms(run.started_at, now) if run.started_at else None
        event = self._event(
            run,
            "flow.cancelled",
            {"status": "cancelled", "steps_executed": run.steps_executed, "duration_ms": duration},
            now,
        )
        values = {"finished_at": now, "duration_ms": duration}
        pending = _Pending()
        stopped = {"type": "cancelled", "message": "the run was cancelled during this step"}
        self._close_open(run, pending, now, stopped, cut=True)
        await self._write(run, ((RunStatus.CANCELLED, values, False),), pending.steps, [event])
        metrics.RUNS_FINISHED.labels(status="cancelled").inc()
        return RunStatus.CANCELLED


def _next_attempt(prior: RunStep | None) -> tuple[int, tuple[int, ...]]:
    """The number of a step's next attempt, and its attempts interrupted so far, from its
    record (``None`` before its first attempt)."""
    if prior is None:
        return 1, ()
    if prior.status is StepStatus.RUNNING:  # the attempt in flight at a crash
        return prior.attempts + 1, (*prior.interrupted, prior.attempts)
    if prior.status is StepStatus.RETRYING:
        return prior.attempts + 1, prior.interrupted
    return 1, ()


def _output_problem(output: Any, limit: int) -> str | None:
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


def _check_output(outcome: Outcome, limit: int) -> None:
    """A step output must be JSON and at most ``limit`` bytes; one that is not fails the step
    (instead of the worker) and is not stored."""
    problem = _output_problem(outcome.output, limit)
    if problem is not None:
        outcome.output = None
        outcome.error = {"type": "output", "message": problem}
        outcome.action = "fail"
