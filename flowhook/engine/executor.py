"""Runs one claimed run, step by step, from its first unfinished step.

Pure steps (``transform``, ``condition``, ``fail``) are collected and committed together with
their events and the run's progress in one transaction: running them again after a crash
gives the same result, so nothing is lost by committing late. Every commit is guarded by
the lease, so a worker that lost its run cannot overwrite the one that took over.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from flowhook.clock import Clock
from flowhook.definition import ExpressionError, Renderer, compile_value
from flowhook.engine.steps import Context, Outcome, Step, build_step
from flowhook.events import make_event
from flowhook.store import events as events_store
from flowhook.store import flows as flows_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Event, Run, RunStatus, RunStep, StepStatus

__all__ = ["Executor", "CompiledFlow"]

log = logging.getLogger("flowhook.engine")


@dataclass(slots=True)
class CompiledFlow:
    steps: list[Step]
    index: dict[str, int]
    output: Renderer | None

    @classmethod
    def build(cls, definition: dict[str, Any]) -> CompiledFlow:
        steps = [build_step(spec) for spec in definition["steps"]]
        output = compile_value(definition["output"]) if "output" in definition else None
        return cls(steps, {s.id: i for i, s in enumerate(steps)}, output)


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


class Executor:
    def __init__(self, db: Database, clock: Clock, owner: str, *, cache_size: int = 1024) -> None:
        self._db = db
        self._clock = clock
        self._owner = owner
        self._flows: OrderedDict[tuple[str, int], CompiledFlow] = OrderedDict()
        self._cache_size = cache_size

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
        """Run ``run`` to its end; the status it ended in, or ``None`` if its lease was lost."""
        try:
            return await self._execute(run)
        except runs_store.LeaseLost:
            return await self._after_guard_failed(run)

    async def _execute(self, run: Run) -> RunStatus | None:
        if run.cancel_requested_at is not None:
            return await self._cancel(run)
        pending = _Pending()
        now = self._clock.now()
        if run.status is RunStatus.QUEUED:
            run.started_at = now
            pending.values["started_at"] = now
            pending.events.append(
                self._event(
                    run,
                    "flow.started",
                    {"status": "running", "trigger": run.trigger, "flow_version": run.flow_version},
                    now,
                )
            )
        compiled = await self._compiled(run)
        if compiled is None:
            missing = {"type": "definition", "message": "the flow version of this run is missing"}
            return await self._finish(run, pending, RunStatus.FAILED, error=missing)

        ctx: Context = {
            "payload": run.payload,
            "steps": {},
            "run": {"id": run.run_id, "flow_id": run.flow_id, "trigger": run.trigger},
        }
        if run.next_step > 0:
            async with self._db.read() as conn:
                done = await runs_store.get_run_by_id(conn, run.run_id)
            for s in done.steps if done else []:
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
            if not step.pure and pending:
                await self._commit(run, pending, idx)
                pending = _Pending()
            started = self._clock.now()
            outcome = await step.run(ctx)
            _check_json(outcome)
            finished = self._clock.now()
            record = RunStep(
                idx=idx,
                step_id=step.id,
                type=step.type,
                status=StepStatus.FAILED if outcome.error else StepStatus.COMPLETED,
                attempts=1,
                started_at=started,
                finished_at=finished,
                duration_ms=_ms(started, finished),
                output=outcome.output,
                error=outcome.error,
            )
            pending.steps.append(record)
            pending.events.append(self._step_event(run, record, finished))
            ctx["steps"][step.id] = {"output": outcome.output, "status": str(record.status)}
            run.steps_executed += 1
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
            if not step.pure:
                await self._commit(run, pending, idx)
                pending = _Pending()

        output = None
        if compiled.output is not None:
            try:
                output = compiled.output(ctx)
                orjson.dumps(output)
            except (ExpressionError, TypeError) as exc:
                failure = {"type": "expression", "message": f"flow output: {exc}", "step": None}
                return await self._finish(
                    run, pending, RunStatus.FAILED, next_step=idx, error=failure
                )
        return await self._finish(run, pending, RunStatus.COMPLETED, next_step=idx, output=output)

    def _step_event(self, run: Run, step: RunStep, now: datetime) -> Event:
        payload: dict[str, Any] = {
            "step_id": step.step_id,
            "type": step.type,
            "attempt": step.attempts,
            "duration_ms": step.duration_ms,
        }
        if step.status is StepStatus.FAILED:
            payload["error"] = step.error
            payload["will_retry"] = False
            return self._event(run, "flow.step_failed", payload, now)
        payload["output"] = step.output
        return self._event(run, "flow.step_completed", payload, now)

    async def _commit(self, run: Run, pending: _Pending, next_step: int) -> None:
        values = {**pending.values, "next_step": next_step, "steps_executed": run.steps_executed}
        async with self._db.transaction() as conn:
            await runs_store.save_progress(
                conn,
                run.run_id,
                owner=self._owner,
                status=RunStatus.RUNNING,
                values=values,
                steps=pending.steps,
            )
            await events_store.insert_events(conn, pending.events)
        run.status = RunStatus.RUNNING

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
        async with self._db.transaction() as conn:
            if run.status is RunStatus.QUEUED:  # started and finished in one commit
                await runs_store.save_progress(
                    conn, run.run_id, owner=self._owner, status=RunStatus.RUNNING, values={}
                )
            await runs_store.save_progress(
                conn,
                run.run_id,
                owner=self._owner,
                status=status,
                values=values,
                steps=pending.steps,
            )
            await events_store.insert_events(conn, pending.events)
        run.status = status
        return status

    async def _after_guard_failed(self, run: Run) -> RunStatus | None:
        async with self._db.read() as conn:
            current = await runs_store.get_run_by_id(conn, run.run_id)
        if current is None or current.status.terminal:
            return None
        if current.cancel_requested_at is not None:
            current.started_at = current.started_at or run.started_at
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
        async with self._db.transaction() as conn:
            await runs_store.save_progress(
                conn,
                run.run_id,
                owner=self._owner,
                status=RunStatus.CANCELLED,
                values={"finished_at": now, "duration_ms": duration},
                honour_cancel=False,
            )
            await events_store.insert_events(conn, [event])
        return RunStatus.CANCELLED


def _check_json(outcome: Outcome) -> None:
    """A step output must be JSON; one that is not fails the step instead of the worker."""
    try:
        orjson.dumps(outcome.output)
    except TypeError as exc:
        outcome.output = None
        outcome.error = {"type": "expression", "message": f"output is not JSON: {exc}"}
        outcome.action = "fail"
