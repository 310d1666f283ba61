"""``parallel`` and ``map``: steps that run lists of steps side by side. Each branch of a
``parallel`` and each item of a ``map`` runs as a *part*: a row of the run queue any worker
claims, with its own durable step records, so a map is spread over every worker and a crash
resumes each part at its first unfinished step. The steps say what to start; their durable
half (:class:`Fan`) queues the parts and gathers their outputs.

- ``parallel``: ``branches`` by name; output ``{name: that branch's last output}``.
- ``map``: ``items`` (an expression giving a list, or a literal list), ``concurrency``
  (default 10) parts at once, each seeing ``item`` and ``index``; output: each item's last
  output, in item order. More than ``FLOWHOOK_MAX_MAP_ITEMS`` items fail the step.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import (
    Action,
    Context,
    Lists,
    Outcome,
    Step,
    StepBase,
    StepEnv,
    error,
)
from flowhook.engine.steps.delay import parse_time
from flowhook.engine.steps.nested import STORE, NestedStore
from flowhook.events import elapsed_ms
from flowhook.ids import new_id
from flowhook.store.models import Run, RunStatus, RunStep, StepStatus

if TYPE_CHECKING:
    from flowhook.engine.durable import Attempt, Cursor

__all__ = ["ParallelStep", "MapStep", "DEFAULT_MAP_CONCURRENCY", "DEFAULT_MAX_MAP_ITEMS"]

DEFAULT_MAP_CONCURRENCY = 10
DEFAULT_MAX_MAP_ITEMS = 1000


def _until(env: StepEnv, seconds: float | None) -> tuple[Any, str | None]:
    if seconds is None:
        return None, None
    until = env.clock.now() + timedelta(seconds=seconds)
    return until, isoformat(until)


class Fan:
    """The durable half of a step that runs parts: queue them (the first ``released`` of
    them claimable now) and sleep until the last one ends, one fails, or the step's time is
    up; then gather their outputs (:meth:`gather`)."""

    id: str
    timeout_after: float | None
    store: NestedStore = STORE

    def released(self, parts: int) -> int:
        """How many of the parts may run at once."""
        return parts

    sees_branches = False
    """Whether later steps reach the steps of its parts as ``steps.<id>`` (a parallel's)."""

    def gather(self, parts: list[Run]) -> Any:
        """The step's output from its parts' (all completed)."""
        raise NotImplementedError

    async def park(self, cur: Cursor, attempt: Attempt, outcome: Outcome) -> RunStatus | None:
        """Queue the parts and sleep without a lease until the last one ends, one fails, or
        the step's time is up. The parts and the step's ``waiting`` record are one commit."""
        step: Step = attempt.step
        specs: list[dict[str, Any]] = outcome.output["parts"]
        now = cur.now()
        if not specs:  # a map over an empty list
            done = Outcome(output=[])
            return await cur.done(step, attempt.record(StepStatus.COMPLETED, now, done), done)
        parts = [self._part(cur.run, attempt, spec, now, cur.under_step(attempt)) for spec in specs]
        cur.add(attempt.waiting({"parts": len(parts), "until": outcome.output["until"]}))
        progress = cur.progress(wake=min(outcome.wait_until or cur.deadline, cur.deadline))
        async with cur.transaction() as conn:
            await self.store.insert_parts(conn, parts, released=self.released(len(parts)))
            await cur.apply_in(conn, progress)
        cur.written()
        return RunStatus.RUNNING

    def _part(
        self, run: Run, attempt: Attempt, spec: dict[str, Any], now: datetime, under: str
    ) -> Run:
        return Run(
            run_id=new_id("part"), workspace_id=run.workspace_id, mode=run.mode,
            flow_id=run.flow_id, flow_version=run.flow_version, trigger="part",
            status=RunStatus.QUEUED, payload={}, queued_at=now,
            parent_run_id=run.run_id, parent_idx=attempt.idx,
            root_run_id=run.root_run_id or run.run_id,
            scope={
                "step": self.id, "depth": (run.scope or {}).get("depth", 0), "tree": run.tree,
                **spec,
            },
            traceparent=under, tree_run_id=run.tree,
        )  # fmt: skip

    async def wake(self, cur: Cursor, prior: RunStep, now: datetime) -> RunStatus | None:
        """Every part completed (the step's output gathers theirs), one failed (the others are
        stopped and the step fails), the step's time is up (likewise), or the run was woken
        early (it sleeps again, under the lock the parts' ends take)."""
        step = cast("Step", self)  # a Fan is one of the step types below
        run, store = cur.run, self.store
        until = prior.output.get("until")
        deadline = min(parse_time(until), cur.deadline) if until else cur.deadline
        async with cur.transaction() as conn:
            await store.lock_parent(conn, run.run_id)
            parts = await store.parts_at(conn, run.run_id, cur.idx)
            failed = [p for p in parts if p.status in (RunStatus.FAILED, RunStatus.CANCELLED)]
            going = any(not p.status.terminal for p in parts)
            if going and not failed and now < deadline:
                await cur.apply_in(conn, cur.progress(wake=deadline))
                cur.written()
                return RunStatus.RUNNING
            if going:  # the others stop (their children may hold slots)
                await store.stop(conn, run.run_id, now, idx=cur.idx)
        run.steps_executed += sum(p.steps_executed for p in parts)
        finished = replace(
            prior, finished_at=now, duration_ms=elapsed_ms(prior.started_at or now, now)
        )
        error: dict[str, Any] | None = None
        if failed:
            error = _part_error(failed[0])
        elif going:
            seconds = self.timeout_after or cur.timeout
            error = {"type": "timeout", "message": f"step took longer than {seconds:g} s"}
        if error is not None:
            failed_record = replace(finished, status=StepStatus.FAILED, output=None, error=error)
            return await cur.done(step, failed_record, Outcome(error=error, action=Action.FAIL))
        outcome = Outcome(output=self.gather(parts))
        cur.check_output(outcome)
        if outcome.error is not None:
            failed_record = replace(
                finished, status=StepStatus.FAILED, output=None, error=outcome.error
            )
            return await cur.done(step, failed_record, outcome)
        if self.sees_branches:
            await cur.see_branches(cur.idx)
        completed = replace(finished, status=StepStatus.COMPLETED, output=outcome.output)
        # the parts' ends are stored (their rows): found again after a crash
        return await cur.done(step, completed, outcome, durable=True)


def _part_error(part: Run) -> dict[str, Any]:
    """Why a ``parallel`` or ``map`` step failed: the part that failed first in order."""
    scope = part.scope or {}
    why = "was cancelled" if part.status is RunStatus.CANCELLED else "failed"
    detail = (part.error or {}).get("message")
    tail = f": {detail}" if detail else ""
    if "branch" in scope:
        message = f"branch {scope['branch']!r} {why}{tail}"
        return {"type": "branch_failed", "message": message, "branch": scope["branch"]}
    message = f"item {scope.get('index')} {why}{tail}"
    return {"type": "item_failed", "message": message, "index": scope.get("index")}


class ParallelStep(Fan, StepBase, kind="parallel", pure=False, external=False, limited=False):
    sees_branches = True

    def __init__(self, spec: dict[str, Any], branches: dict[str, list[Step]]) -> None:
        super().__init__(spec)
        self.branches = branches
        self.timeout_after: float | None = spec.get("timeout_seconds")

    def nested(self) -> Lists:
        return {(self.id, name): steps for name, steps in self.branches.items()}

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """The parts to start: one per branch, ``{"parts": [{"branch"}…], "until"}``."""
        until, text = _until(env, self.timeout_after)
        parts = [{"branch": name} for name in self.branches]
        return Outcome(
            output={"parts": parts, "until": text}, action=Action.SUSPEND, wait_until=until
        )

    def gather(self, parts: list[Run]) -> Any:
        return {(p.scope or {}).get("branch"): p.output for p in parts}


class MapStep(Fan, StepBase, kind="map", pure=False, external=False, limited=False):
    def __init__(self, spec: dict[str, Any], steps: list[Step]) -> None:
        super().__init__(spec)
        self.steps = steps
        self._items = compile_value(spec["items"])
        self.concurrency: int = spec.get("concurrency", DEFAULT_MAP_CONCURRENCY)
        self.timeout_after: float | None = spec.get("timeout_seconds")

    def nested(self) -> Lists:
        return {(self.id, None): self.steps}

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """The parts to start: one per item, ``{"parts": [{"index", "item"}…], "until"}``."""
        try:
            items = await evaluate(self._items, ctx)
        except ExpressionError as exc:
            return error("expression", f"items: {exc}")
        if not isinstance(items, list):
            kind = "null" if items is None else type(items).__name__
            return error("map_items", f"items must be a list, not {kind}")
        if len(items) > env.max_map_items:
            return error(
                "map_items",
                f"{len(items)} items, more than {env.max_map_items} (FLOWHOOK_MAX_MAP_ITEMS)",
            )
        until, text = _until(env, self.timeout_after)
        parts = [{"index": i, "item": item} for i, item in enumerate(items)]
        return Outcome(
            output={"parts": parts, "until": text}, action=Action.SUSPEND, wait_until=until
        )

    def released(self, parts: int) -> int:
        return self.concurrency

    def gather(self, parts: list[Run]) -> Any:
        return [p.output for p in parts]
