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
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from flowhook import tracing
from flowhook.clock import Clock, isoformat
from flowhook.definition import ExpressionError, Renderer, compile_value, evaluate
from flowhook.definition.control import FlowControl, throttle_start
from flowhook.definition.sandbox import weight
from flowhook.engine import metrics, spans
from flowhook.engine.retry import backoff_seconds
from flowhook.engine.steps import Context, Outcome, Step, StepEnv, build_step
from flowhook.engine.steps.base import error as failure
from flowhook.engine.steps.call import MAX_DEPTH
from flowhook.engine.steps.fan import MapStep, ParallelStep
from flowhook.engine.steps.wait import WaitStep
from flowhook.events import cancelled_event, elapsed_ms, run_duration_ms, run_event
from flowhook.ids import new_id
from flowhook.store import approvals as approvals_store
from flowhook.store import children as children_store
from flowhook.store import control as control_store
from flowhook.store import events as events_store
from flowhook.store import flows as flows_store
from flowhook.store import runs as runs_store
from flowhook.store import signals as signals_store
from flowhook.store import trees as trees_store
from flowhook.store.db import Database
from flowhook.store.models import Event, Run, RunStatus, RunStep, StepStatus
from flowhook.store.types import json_has_nul

__all__ = ["Executor", "CompiledFlow", "DEFAULT_RUN_TIMEOUT", "DEFAULT_MAX_OUTPUT_BYTES"]


if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

log = logging.getLogger("flowhook.engine")
DEFAULT_RUN_TIMEOUT = 3600.0
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024
UNLIMITED = 1_000_000
_HELD_KEEPS = frozenset({"concurrency_key", "concurrency_slot", "throttle_at", "throttle_key"})
"""What a run handed back held keeps of its admission: the slot it took, the start reserved."""
"""The slots of a key whose flow no longer caps it: every held run goes."""


@dataclass(slots=True)
class CompiledFlow:
    steps: list[Step]
    output: Renderer | None
    timeout: float
    control: FlowControl | None
    """The flow's flow control (``None``: none, nothing to admit)."""
    lists: dict[tuple[str, str | None], list[Step]] = field(default_factory=dict)
    """The step lists nested in ``parallel`` and ``map`` steps, by (step id, branch name)."""

    @classmethod
    def build(cls, definition: dict[str, Any]) -> CompiledFlow:
        steps = [build_step(spec) for spec in definition["steps"]]
        output = compile_value(definition["output"]) if "output" in definition else None
        timeout = float(definition.get("timeout_seconds", DEFAULT_RUN_TIMEOUT))
        compiled = cls(steps, output, timeout, FlowControl.build(definition))
        compiled._index(steps)
        return compiled

    def _index(self, steps: list[Step]) -> None:
        for step in steps:
            if isinstance(step, ParallelStep):
                for name, branch in step.branches.items():
                    self.lists[(step.id, name)] = branch
                    self._index(branch)
            elif isinstance(step, MapStep):
                self.lists[(step.id, None)] = step.steps
                self._index(step.steps)

    def part(self, scope: dict[str, Any]) -> CompiledFlow | None:
        """What a part runs: the list of its branch or of its map's steps (no output, no
        cap of its own); ``None`` when this version has no such list."""
        steps = self.lists.get((scope["step"], scope.get("branch")))
        if steps is None:
            return None
        return CompiledFlow(steps, None, self.timeout, None, self.lists)


@dataclass(slots=True)
class _Pending:
    """Writes not yet committed: step rows, events and the run's new values."""

    steps: list[RunStep] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.steps or self.events or self.values)


async def _build(definition: dict[str, Any]) -> CompiledFlow:
    """A flow version compiled off the event loop: its expressions may take a second to
    compile (bounded when it was saved), and the runs of every other flow go on meanwhile. In
    the process that saved it the compiled expressions are remembered, so this is quick."""
    return await asyncio.to_thread(CompiledFlow.build, definition)


@dataclass(slots=True)
class _InFlight:
    """A run being executed by this worker: where it is, what it has not committed yet, and
    the expression context its steps see."""

    run: Run
    flow: CompiledFlow
    earlier: dict[int, RunStep]
    """The step records earlier claims committed, by index."""
    ctx: Context
    deadline: datetime
    """When the run's ``timeout_seconds`` is up."""
    idx: int
    """The step to run next."""
    pending: _Pending
    skip_to: str | None = None
    """A ``goto`` target: the steps before it are skipped."""
    ended: bool = False
    """A step ended the run early (``end``): what is left is the flow's output."""


@dataclass(slots=True)
class _Attempt:
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


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _context(run: Run, earlier: dict[int, RunStep]) -> Context:
    """What a run's expressions see: its payload, the steps finished so far, the run."""
    ctx: Context = {
        "payload": run.payload,
        "steps": {},
        "run": {"id": run.run_id, "flow_id": run.flow_id, "trigger": run.trigger},
    }
    for s in earlier.values():
        if s.status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
            ctx["steps"][s.step_id] = {"output": s.output, "status": str(s.status)}
    return ctx


class Executor:
    """Runs a claimed run in stages: :meth:`_resume` (pick it up where it stopped),
    :meth:`_next_step` (skip, wake or attempt one step), :meth:`_attempt` (the step itself,
    within its timeouts), :meth:`_settle` (record the outcome: wait, retry, go on, fail, end,
    goto) and :meth:`_complete` / :meth:`_finish` / :meth:`_cancel` (end the run)."""

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
        self._max_map_items = max_map_items
        self._max_run_tree = max_run_tree
        self._scopes: OrderedDict[
            tuple[str, int], asyncio.Future[tuple[Context, datetime] | None]
        ] = OrderedDict()
        """What the parts of a ``parallel`` or ``map`` step see of the runs around them, and
        when their root run started, by (parent row, step index): fixed while they run."""
        self._public_url = public_url.rstrip("/")
        """Where people reach this service: approval links start with it."""
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
        self._latest: dict[str, tuple[int, float]] = {}
        """Each flow's latest version, read at most once a second (its concurrency limit)."""
        self.in_step: set[str] = set()
        """Runs whose step is in flight now: the ones a cancel may interrupt."""
        self.cancelling: set[str] = set()
        """Runs whose task the worker cancelled because a cancel was requested."""
        self._open: dict[str, tuple[RunStep, bool]] = {}
        """Per run: its step whose ``running`` record is committed and has no outcome yet, and
        whether a crash already cut that attempt short (found so on a resumed run)."""
        self._unwritten: dict[str, tuple[list[RunStep], list[Event]]] = {}
        """Per part: the step records and events of a write its guard refused. A part whose
        sibling failed is flagged, not interrupted: its step in flight ends, and the cancel
        that follows keeps that step's result (see :meth:`_lost`)."""

    async def _apply_alone(self, progress: runs_store.Progress) -> bool:
        async with self._db.transaction() as conn:
            [ok] = await runs_store.apply_progress(conn, [progress], owner=self._owner)
        return ok

    async def _write(
        self,
        run: Run,
        changes: tuple[runs_store.StatusChange, ...],
        steps: list[RunStep],
        events: list[Event],
    ) -> None:
        """Write a run's progress (possibly in a transaction shared with other runs); raises
        LeaseLost when the run's guard fails. A run that ends also does what its end asks
        (see :meth:`_ending`) in the same write."""
        end = changes[-1].status
        if end.terminal and run.concurrency_slot is not None:
            changes[-1].values["concurrency_slot"] = None  # given to the next held run
        progress = runs_store.Progress(run.run_id, changes, steps, events)
        if end.terminal:
            extra = self._ending(run, end)
            if extra is not None:
                progress = replace(
                    progress, before=extra.before, lock_key=extra.lock_key, after=extra.after
                )
        if not await self._apply(progress):
            raise self._lost(run, steps, events)
        if end.terminal and tracing.ENABLED:
            tracing.run_span(run, end, changes[-1].values.get("error"), self._clock.now())

    def _lost(self, run: Run, steps: list[RunStep], events: list[Event]) -> runs_store.LeaseLost:
        """The error for a write of ``run`` its guard refused. A part keeps what the write
        held: when the refusal was a cancel (a sibling failed), the steps that finished before
        it are recorded as they ended, not as cut short (DESIGN.md: the others stop at their
        next step boundary)."""
        if run.root_run_id is not None:
            self._unwritten[run.run_id] = (steps, events)
        return runs_store.LeaseLost(run.run_id)

    async def _compiled(self, run: Run) -> CompiledFlow | None:
        key = (run.flow_id, run.flow_version)
        compiled = self._flows.get(key)
        if compiled is None:
            async with self._db.read() as conn:
                definition = await flows_store.get_definition(conn, *key)
            if definition is None:
                return None
            compiled = await _build(definition)
            self._flows[key] = compiled
            if len(self._flows) > self._cache_size:
                self._flows.popitem(last=False)
        else:
            self._flows.move_to_end(key)
        return compiled

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
            self._unwritten.pop(run.run_id, None)

    async def _execute(self, run: Run) -> RunStatus:
        state = await self._resume(run)
        if not isinstance(state, _InFlight):
            return state
        while state.idx < len(state.flow.steps) and not state.ended:
            stopped = await self._next_step(state)
            if stopped is not None:
                return stopped
        return await self._complete(state)

    # -- resume: pick the run up where it stopped ------------------------------------------

    async def _resume(self, run: Run) -> _InFlight | RunStatus:
        """The run ready for its next step; or the status it is left in when it goes no
        further now (cancelled, held back by its flow's concurrency, failed before a step)."""
        if run.cancel_requested_at is not None:
            if run.status is RunStatus.RUNNING:
                await self._load_earlier(run)
            return await self._cancel(run)
        compiled = await self._compiled(run)
        if run.root_run_id is not None:
            return await self._resume_part(run, compiled)
        # resumed: what earlier claims recorded
        resumed = run.status is RunStatus.RUNNING
        pending = _Pending()
        control = None if compiled is None else compiled.control
        if control is not None and control.admits and not resumed:
            if not await self._admit(run, control):
                return run.status
        elif not resumed:
            self._start(run, pending)
        # a resumed run, or a rerun that starts after the steps it reuses
        earlier = await self._load_earlier(run) if resumed or run.next_step else {}
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
        ctx = _context(run, earlier)
        await self._see_branches(run, earlier, ctx)
        return _InFlight(
            run=run,
            flow=compiled,
            earlier=earlier,
            ctx=ctx,
            deadline=run.started_at + timedelta(seconds=compiled.timeout),
            idx=run.next_step,
            pending=pending,
        )

    async def _see_branches(
        self, run: Run, earlier: dict[int, RunStep], ctx: Context, *, idxs: list[int] | None = None
    ) -> None:
        """Let later steps reach the steps of the branches of finished ``parallel`` steps
        (those at ``idxs``, or every one among ``earlier``, including those a rerun reused)
        as ``steps.<id>``."""
        if idxs is None and not any(s.type == "parallel" for s in earlier.values()):
            return
        async with self._db.read() as conn:
            if idxs is None:
                records = list(earlier.values())
                found = await children_store.reached_branch_steps(conn, run, records)
            else:
                found = await children_store.branch_steps(conn, run.run_id, idxs)
        for s in found:
            ctx["steps"][s.step_id] = {"output": s.output, "status": str(s.status)}

    async def _resume_part(self, run: Run, compiled: CompiledFlow | None) -> _InFlight | RunStatus:
        """A part (a branch of a ``parallel``, an item of a ``map``) ready for its next step:
        it runs its list of steps, seeing what its run saw when the step started the parts,
        and its own ``item`` and ``index`` in a map; the run's timeout bounds it. It raises no
        run events and counts against no cap."""
        pending = _Pending()
        if run.status is RunStatus.QUEUED:
            run.started_at = pending.values["started_at"] = self._clock.now()
        earlier = await self._load_earlier(run) if run.status is RunStatus.RUNNING else {}
        if run.claims > self._max_claims:
            lost = {
                "type": "worker_lost",
                "message": f"the part lost its worker {run.claims - 1} times in a row",
                "step": None,
            }
            return await self._finish(run, pending, RunStatus.FAILED, error=lost)
        flow = compiled.part(run.scope or {}) if compiled is not None else None
        scope = await self._scope_of(run)
        if flow is None or scope is None:
            missing = {"type": "definition", "message": "the steps of this part are missing"}
            return await self._finish(run, pending, RunStatus.FAILED, error=missing)
        around, root_started = scope
        ctx: Context = {**around, "steps": dict(around["steps"])}
        own = run.scope or {}
        if "index" in own:
            ctx["item"], ctx["index"] = own["item"], own["index"]
        for s in earlier.values():
            if s.status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
                ctx["steps"][s.step_id] = {"output": s.output, "status": str(s.status)}
        await self._see_branches(run, earlier, ctx)
        return _InFlight(
            run=run,
            flow=flow,
            earlier=earlier,
            ctx=ctx,
            deadline=root_started + timedelta(seconds=flow.timeout),
            idx=run.next_step,
            pending=pending,
        )

    async def _scope_of(self, part: Run) -> tuple[Context, datetime] | None:
        """What a part sees of the runs around it (its run's payload and finished steps, and
        those of the parts it is nested in, with their ``item`` and ``index``) and when its
        run started; read once per step that started parts (parts claimed together share the
        one read), then cached: it does not change while they run."""
        assert part.parent_run_id is not None
        assert part.parent_idx is not None
        key = (part.parent_run_id, part.parent_idx)
        pending = self._scopes.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._read_scope(part.parent_run_id))
            self._scopes[key] = pending
            if len(self._scopes) > 256:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end(key)
        try:
            return await asyncio.shield(pending)
        except Exception:
            self._scopes.pop(key, None)  # read again next time
            raise

    async def _read_scope(self, holder_id: str | None) -> tuple[Context, datetime] | None:
        chain: list[Run] = []
        branches: list[RunStep] = []
        async with self._db.read() as conn:
            while holder_id is not None:
                holder = await runs_store.get_run_by_id(conn, holder_id)
                if holder is None:
                    return None
                chain.append(holder)
                # what the branches of its finished parallel steps ran is in reach too
                branches += await children_store.reached_branch_steps(conn, holder, holder.steps)
                holder_id = holder.parent_run_id if holder.root_run_id is not None else None
        root = chain[-1]
        ctx = _context(root, {s.idx: s for s in root.steps})
        for holder in reversed(chain[:-1]):
            for s in holder.steps:
                if s.status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
                    ctx["steps"][s.step_id] = {"output": s.output, "status": str(s.status)}
            scope = holder.scope or {}
            if "index" in scope:
                ctx["item"], ctx["index"] = scope["item"], scope["index"]
        for s in branches:
            ctx["steps"].setdefault(s.step_id, {"output": s.output, "status": str(s.status)})
        return ctx, root.started_at or root.queued_at

    async def _admit(self, run: Run, control: FlowControl) -> bool:
        """Whether the flow's ``concurrency`` and ``throttle`` let a queued run start now.

        Decided in the group write that starts it (``running``, ``flow.started``), by a
        ``before`` hook serialised per flow and key (see :mod:`flowhook.store.control`): the
        run takes a slot of its key and its reserved start; or the hook hands it back held,
        with no lease, until a slot is given to it or its start comes. Admissions sharing a
        transaction count each other (``conn.info``): the slots they take are written only
        after every hook ran."""
        now = self._clock.now()
        owner = self._owner
        pending = _Pending()
        self._start(run, pending, now, observe=False)
        values: dict[str, Any] = {
            **pending.values, "held": None,
            "next_step": run.next_step, "steps_executed": run.steps_executed,
        }  # fmt: skip
        outcome: dict[str, str] = {}
        flow_id = run.flow_id

        async def hold(conn: AsyncConnection, reason: str, **how: Any) -> bool:
            kept = {k: v for k, v in values.items() if k in _HELD_KEEPS}
            if await control_store.hold(
                conn, run.run_id, owner=owner, reason=reason, values=kept, **how
            ):
                outcome["held"] = reason
            else:
                outcome["lost"] = reason
            return False  # nothing else of this item to write

        async def admission(conn: AsyncConnection) -> bool:
            scratch = conn.info.setdefault("tx", {})  # this transaction's, see Database
            taking: dict[tuple[str, str, str], Any] = scratch.setdefault("admitting", {})
            if control.concurrency is not None and run.concurrency_slot is None:
                key = run.concurrency_key or ""
                await control_store.lock(conn, control_store.CONCURRENCY, flow_id, key)
                mine = ("c", flow_id, key)
                taken, waiting = await control_store.slots_taken(conn, flow_id, key)
                taken += taking.get(mine, 0)
                limit = await self._limit_now(conn, flow_id)
                if taken >= limit:
                    values["concurrency_key"] = key
                    return await hold(conn, control_store.CONCURRENCY)
                taking[mine] = taking.get(mine, 0) + 1
                values["concurrency_slot"] = key
                if waiting:  # room left (the limit was raised): held runs take it too
                    room = limit - taken - 1
                    await control_store.give_slots(conn, flow_id, key, room, now)  # counted
            if control.throttle_limit:
                return await throttled(conn, taking)
            return True

        async def throttled(conn: AsyncConnection, taking: dict[Any, Any]) -> bool:
            """Reserve the run's start; or, woken at the start it reserved, start only if
            fewer than ``limit`` runs of its key really started within the last period (a
            run that started late must not crowd the next window), else reserve again."""
            key = run.throttle_key or ""
            limit, period = control.throttle_limit, control.throttle_period
            await control_store.lock(conn, control_store.THROTTLE, flow_id, key)
            mine: list[datetime] = taking.setdefault(("t", flow_id, key), [])
            since = None if run.throttle_at is None else now - timedelta(seconds=period)
            counted = await control_store.reserved_starts(
                conn, flow_id, key, limit, started_since=since
            )
            latest = sorted([*mine, *counted], reverse=True)[:limit]
            start = throttle_start(latest, limit, period, now)
            values.update(throttle_at=start, throttle_key=key)
            if start > now:  # the hold writes its reserved start now: the store counts it
                return await hold(conn, control_store.THROTTLE, until=start)
            mine.append(start)  # written after every hook: until then, counted here
            return True

        if control.concurrency is not None and run.concurrency_slot is None:
            lock_key = control_store.lock_key(
                control_store.CONCURRENCY, flow_id, run.concurrency_key or ""
            )
        else:
            lock_key = control_store.lock_key(
                control_store.THROTTLE, flow_id, run.throttle_key or ""
            )
        change = runs_store.StatusChange(RunStatus.RUNNING, values)
        progress = runs_store.Progress(
            run.run_id, (change,), [], pending.events, before=admission, lock_key=lock_key
        )
        if not await self._apply(progress) or "lost" in outcome:
            raise runs_store.LeaseLost(run.run_id)
        if "held" in outcome:
            run.started_at = None
            metrics.RUNS_HELD.labels(reason=outcome["held"]).inc()
            return False
        metrics.START_LATENCY.observe(max(0.0, (now - run.queued_at).total_seconds()))
        run.status = RunStatus.RUNNING
        run.held = None
        run.concurrency_slot = values.get("concurrency_slot", run.concurrency_slot)
        return True

    def _start(
        self, run: Run, pending: _Pending, now: datetime | None = None, *, observe: bool = True
    ) -> None:
        """A queued run starts now (``flow.started``, committed with what follows)."""
        now = self._clock.now() if now is None else now
        run.started_at = now
        pending.values["started_at"] = now
        if run.held is not None:  # a debounced run: it starts, nothing holds it now
            pending.values["held"] = None
            run.held = None
        if observe:
            metrics.START_LATENCY.observe(max(0.0, (now - run.queued_at).total_seconds()))
        payload = {"status": "running", "trigger": run.trigger, "flow_version": run.flow_version}
        pending.events.append(run_event(run, "flow.started", payload, now))

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

    # -- one step ------------------------------------------------------------------------

    async def _next_step(self, state: _InFlight) -> RunStatus | None:
        """Skip, wake or attempt the step at ``state.idx``; the status the run is left in when
        it stops here (ended, or asleep until a wake-up), else ``None``."""
        step = state.flow.steps[state.idx]
        if state.skip_to is not None and step.id != state.skip_to:
            self._skip(state, step)
            return None
        state.skip_to = None
        now = self._clock.now()
        if now >= state.deadline:
            return await self._timed_out(state, step.id)
        prior = state.earlier.get(state.idx)
        if prior is not None and prior.status is StepStatus.WAITING:
            return await self._wake(state, prior, now)
        attempt = await self._begin(state, step, prior, now)
        outcome = await self._attempt(state, attempt)
        if outcome is None:
            return await self._timed_out(state, step.id)
        return await self._settle(state, attempt, outcome)

    def _skip(self, state: _InFlight, step: Step) -> None:
        """Record ``step`` skipped by a ``goto`` past it."""
        state.pending.steps.append(
            RunStep(
                idx=state.idx,
                step_id=step.id,
                type=step.type,
                status=StepStatus.SKIPPED,
                attempts=0,
            )
        )
        state.ctx["steps"][step.id] = {"output": None, "status": "skipped"}
        state.idx += 1

    async def _wake(self, state: _InFlight, prior: RunStep, now: datetime) -> RunStatus | None:
        """A step that waits (a delay) is done once its time has come; before that the run
        sleeps again. A ``wait`` step is done when a signal came or its time is up."""
        if prior.type == "wait":
            return await self._wake_wait(state, prior, now)
        if prior.type == "approval":
            return await self._wake_approval(state, prior, now)
        if prior.type == "flow":
            return await self._wake_call(state, prior, now)
        if prior.type in ("parallel", "map"):
            return await self._wake_fan(state, prior, now)
        until = _parse_time(prior.output["until"])
        if now < until:
            return await self._release(state, min(until, state.deadline))
        duration = elapsed_ms(prior.started_at or now, now)
        record = replace(prior, status=StepStatus.COMPLETED, finished_at=now, duration_ms=duration)
        self._record(state, record)
        state.idx += 1
        return None

    async def _begin(
        self, state: _InFlight, step: Step, prior: RunStep | None, now: datetime
    ) -> _Attempt:
        """Before an attempt: a step with effects outside has its start (``running``)
        committed with what is pending; any other step that is not pure commits what is
        pending."""
        number, interrupted = _next_attempt(prior)
        if step.external:
            marker = RunStep(
                idx=state.idx,
                step_id=step.id,
                type=step.type,
                status=StepStatus.RUNNING,
                attempts=number,
                started_at=now,
                interrupted=interrupted,
            )
            state.pending.steps.append(marker)
            await self._commit(state)
            self._open[state.run.run_id] = (marker, False)
        elif not step.pure and state.pending:
            await self._commit(state)
        return _Attempt(step, state.idx, number, interrupted, self._clock.now())

    async def _attempt(self, state: _InFlight, attempt: _Attempt) -> Outcome | None:
        """Run the step within its own timeout and what is left of the run's; its outcome (a
        step that raises or overruns its timeout fails), or ``None`` when the run's time is
        up."""
        run, step = state.run, attempt.step
        run_left = (state.deadline - attempt.started).total_seconds()
        limit = min(step.timeout or run_left, run_left)
        env = StepEnv(
            self._clock, self._http, self._allow_private, run.root_run_id or run.run_id,
            run.flow_id, attempt.number, self._max_map_items, run.run_id, attempt.idx,
            run.traceparent, {} if tracing.ENABLED else None,
        )  # fmt: skip
        self.in_step.add(run.run_id)
        outcome: Outcome | None = None
        try:
            async with asyncio.timeout(limit):
                outcome = await step.run(state.ctx, env)
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
        self._open.pop(run.run_id, None)
        _check_output(outcome, self._max_output)
        return outcome

    # -- settle: record the outcome --------------------------------------------------------

    async def _settle(
        self, state: _InFlight, attempt: _Attempt, outcome: Outcome
    ) -> RunStatus | None:
        """Record the attempt's outcome: the run sleeps (a wait, a retry's backoff), fails, or
        goes on."""
        finished = self._clock.now()
        if outcome.action == "signal":
            return await self._park(state, attempt, outcome)
        if outcome.action == "approval":
            return await self._ask(state, attempt, outcome)
        if outcome.action == "call":
            return await self._call(state, attempt, outcome)
        if outcome.action == "fan":
            return await self._fan(state, attempt, outcome)
        if outcome.action == "wait" and outcome.wait_until is not None:
            state.pending.steps.append(
                RunStep(
                    idx=attempt.idx,
                    step_id=attempt.step.id,
                    type=attempt.step.type,
                    status=StepStatus.WAITING,
                    attempts=attempt.number,
                    started_at=attempt.started,
                    output=outcome.output,
                )
            )
            return await self._release(state, min(outcome.wait_until, state.deadline))
        if outcome.error is not None:
            # an interrupted attempt does not use up the retry budget
            delay = backoff_seconds(attempt.step.retry, attempt.number - len(attempt.interrupted))
            if delay is not None:
                record = attempt.record(StepStatus.RETRYING, finished, outcome)
                state.pending.events.append(self._step_event(state.run, record, will_retry=True))
                state.pending.steps.append(record)
                wake = min(finished + timedelta(seconds=delay), state.deadline)
                return await self._release(state, wake)
        status = StepStatus.FAILED if outcome.error else StepStatus.COMPLETED
        self._record(state, attempt.record(status, finished, outcome))
        state.idx += 1
        return await self._go_on(state, attempt.step, outcome)

    async def _go_on(
        self, state: _InFlight, step: Step, outcome: Outcome, *, durable: bool = False
    ) -> RunStatus | None:
        """After a step's result: follow its ``action`` (fail, end, goto, continue) and commit
        the result of a step that is not pure, unless the next step's start will carry it or
        the result is ``durable`` already (stored where a resumed run finds it again)."""
        if outcome.action == "fail":
            error = dict(outcome.error or {"type": "fail", "message": "step failed"})
            error["step"] = step.id
            return await self._finish(
                state.run, state.pending, RunStatus.FAILED, next_step=state.idx, error=error
            )
        if outcome.action == "end":
            state.ended = True
            return None
        if outcome.action == "goto":
            state.skip_to = outcome.target
        steps = state.flow.steps
        following = steps[state.idx] if state.idx < len(steps) else None
        carried = state.skip_to is None and following is not None and following.external
        if not step.pure and not durable and not carried:
            await self._commit(state)
        # else the commit that records the next step's start records this result too
        return None

    def _record(self, state: _InFlight, record: RunStep) -> None:
        """A step's final record (completed or failed), its event, and what later steps see
        of it."""
        metrics.step_seconds(record.type, str(record.status)).observe(
            (record.duration_ms or 0) / 1000
        )
        state.pending.steps.append(record)
        state.pending.events.append(self._step_event(state.run, record, will_retry=False))
        state.ctx["steps"][record.step_id] = {
            "output": record.output,
            "status": str(record.status),
        }
        state.run.steps_executed += 1

    def _step_event(self, run: Run, step: RunStep, *, will_retry: bool) -> Event:
        now = step.finished_at or self._clock.now()
        payload: dict[str, Any] = {
            "step_id": step.step_id,
            "type": step.type,
            "attempt": step.attempts,
            "duration_ms": step.duration_ms,
        }
        if run.root_run_id is not None:  # a part's step: an event of the run it is part of
            payload.update(_nesting(run.scope or {}))
            run = replace(run, run_id=run.root_run_id)
        if step.error is not None:
            payload["error"] = step.error
            payload["will_retry"] = will_retry
            return run_event(run, "flow.step_failed", payload, now)
        payload["output"] = step.output
        return run_event(run, "flow.step_completed", payload, now)

    def _progress(self, state: _InFlight, **extra: Any) -> runs_store.Progress:
        """What is pending, with the run's progress (still ``running``), as one write."""
        run, pending = state.run, state.pending
        values = {
            **pending.values,
            "next_step": state.idx,
            "steps_executed": run.steps_executed,
            **extra,
        }
        change = runs_store.StatusChange(RunStatus.RUNNING, values)
        return runs_store.Progress(run.run_id, (change,), pending.steps, pending.events)

    async def _commit(self, state: _InFlight, **extra: Any) -> None:
        """Commit what is pending with the run's progress (still ``running``)."""
        if not await self._apply(self._progress(state, **extra)):
            raise self._lost(state.run, state.pending.steps, state.pending.events)
        state.run.status = RunStatus.RUNNING
        state.pending = _Pending()

    async def _release(self, state: _InFlight, wake: datetime) -> RunStatus:
        """Give the run back until ``wake`` (a delay or a retry backoff): no lease, and the
        lost-worker count starts again."""
        await self._commit(state, **_released(wake))
        return RunStatus.RUNNING

    # -- wait: a step that sleeps until a signal -------------------------------------------

    async def _park(
        self, state: _InFlight, attempt: _Attempt, outcome: Outcome
    ) -> RunStatus | None:
        """A ``wait`` step reached: take the signal that matches it if one came since the run
        was queued, else sleep without a lease until one comes (it wakes the run) or the
        step's time is up. The lookup, the registration and the release are one write under
        the signal name's lock, so a signal sent meanwhile is never missed; that write is the
        group write the run's other progress goes through, so parks share commits."""
        run, step = state.run, attempt.step
        assert isinstance(step, WaitStep)
        wait = signals_store.Wait(
            run.run_id, attempt.idx, run.workspace_id, run.mode, step.signal,
            outcome.output["match"], attempt.started, outcome.wait_until, run.root_run_id,
        )  # fmt: skip
        record = RunStep(
            idx=attempt.idx, step_id=step.id, type=step.type, status=StepStatus.WAITING,
            attempts=attempt.number, started_at=attempt.started, output=outcome.output,
        )  # fmt: skip
        wake = min(outcome.wait_until or state.deadline, state.deadline)
        found: list[signals_store.Signal | None] = [None]

        async def look(conn: AsyncConnection) -> bool:
            """In the (group) write: the signal, or the run's release to sleep (True)."""
            await signals_store.lock_name(conn, run.workspace_id, run.mode, step.signal)
            found[0] = await signals_store.find_for_wait(conn, wait, run.queued_at)
            await signals_store.register_wait(
                conn, wait, resolved_by=found[0], now=self._clock.now()
            )
            return found[0] is None

        state.pending.steps.append(record)
        progress = replace(
            self._progress(state, **_released(wake)),
            before=look,
            lock_key=f"signal:{run.workspace_id}:{run.mode}:{step.signal}",
        )
        if not await self._apply(progress):
            raise runs_store.LeaseLost(run.run_id)
        if found[0] is not None:  # nothing pending was written: it goes on with the signal
            state.pending.steps.pop()
            return await self._signalled(state, record, found[0])
        state.pending = _Pending()
        run.status = RunStatus.RUNNING
        return RunStatus.RUNNING

    async def _wake_wait(self, state: _InFlight, prior: RunStep, now: datetime) -> RunStatus | None:
        """A sleeping ``wait`` step's run was claimed: resumed by a signal, timed out (what
        ``on_timeout`` says), or woken early (it sleeps again)."""
        run, step = state.run, state.flow.steps[state.idx]
        name = prior.output["signal"]
        # Most wake-ups are by a signal, which a read finds: no lock and no write for it.
        async with self._db.read() as conn:
            signal = await signals_store.taken(conn, run.run_id, state.idx)
        done = signal is not None
        if signal is None:
            async with self._db.transaction() as conn:
                await signals_store.lock_name(conn, run.workspace_id, run.mode, name)
                done, signal = await signals_store.resolve_wait(conn, run.run_id, state.idx, now)
        if signal is not None:
            return await self._signalled(state, prior, signal)
        if not done:
            until = prior.output.get("until")
            wake = min(_parse_time(until), state.deadline) if until else state.deadline
            return await self._release(state, wake)
        duration = elapsed_ms(prior.started_at or now, now)
        ended = replace(prior, finished_at=now, duration_ms=duration, output=None)
        if getattr(step, "on_timeout", "fail") == "continue":
            self._record(state, replace(ended, status=StepStatus.COMPLETED))
            state.idx += 1
            return await self._go_on(state, step, Outcome())
        seconds = getattr(step, "timeout_after", None) or 0
        error = {"type": "wait_timeout", "message": f"no signal {name!r} came within {seconds:g} s"}
        self._record(state, replace(ended, status=StepStatus.FAILED, error=error))
        state.idx += 1
        return await self._go_on(state, step, Outcome(error=error, action="fail"))

    # -- approval: a step that sleeps until a person decides ----------------------------------

    async def _ask(self, state: _InFlight, attempt: _Attempt, outcome: Outcome) -> RunStatus:
        """An ``approval`` step reached: make its two single-use links, raise
        ``flow.approval_requested`` with them, and sleep without a lease until a decision
        wakes the run or the request expires. The request (links hashed), the event and the
        step's ``waiting`` record are one commit."""
        run, step = state.run, attempt.step
        now = self._clock.now()
        approve, reject = approvals_store.new_token(), approvals_store.new_token()
        until = outcome.wait_until
        message = outcome.output["message"]
        request = approvals_store.Approval(
            run.run_id, attempt.idx, run.workspace_id, run.mode, step.id, message, now, until
        )
        payload = {
            "step_id": step.id,
            "message": message,
            "approve_url": f"{self._public_url}/approvals/{approve}",
            "reject_url": f"{self._public_url}/approvals/{reject}",
            "expires_at": isoformat(until) if until else None,
        }
        about = replace(run, run_id=run.root_run_id) if run.root_run_id is not None else run
        state.pending.events.append(run_event(about, "flow.approval_requested", payload, now))
        state.pending.steps.append(
            RunStep(
                idx=attempt.idx, step_id=step.id, type=step.type, status=StepStatus.WAITING,
                attempts=attempt.number, started_at=attempt.started, output=outcome.output,
            )
        )  # fmt: skip
        wake = min(until or state.deadline, state.deadline)
        async with self._db.transaction() as conn:
            await approvals_store.insert(
                conn,
                request,
                approve_hash=approvals_store.token_hash(approve),
                reject_hash=approvals_store.token_hash(reject),
            )
            progress = self._progress(state, **_released(wake))
            [ok] = await runs_store.apply_progress(conn, [progress], owner=self._owner)
            if not ok:
                raise runs_store.LeaseLost(run.run_id)
        state.pending = _Pending()
        run.status = RunStatus.RUNNING
        return RunStatus.RUNNING

    async def _wake_approval(
        self, state: _InFlight, prior: RunStep, now: datetime
    ) -> RunStatus | None:
        """A sleeping ``approval`` step's run was claimed: decided (approved or rejected),
        expired (``on_timeout`` decides, recorded so a late click no longer counts), or woken
        early (it sleeps again)."""
        step = state.flow.steps[state.idx]
        on_timeout = getattr(step, "on_timeout", "fail")
        async with self._db.transaction() as conn:
            request = await approvals_store.get(conn, state.run.run_id, state.idx)
            if request is not None and request.decision is None and request.expired(now):
                decision = {"approve": "approved", "reject": "rejected"}.get(on_timeout, "timeout")
                await approvals_store.decide(
                    conn, request, decision, by="timeout", comment=None, now=now,
                    before_expiry=False,
                )  # fmt: skip
                request = await approvals_store.get(conn, state.run.run_id, state.idx)
        if request is None or request.decision is None:
            until = prior.output.get("until")
            wake = min(_parse_time(until), state.deadline) if until else state.deadline
            return await self._release(state, wake)
        output = {
            "approved": request.decision == "approved",
            "decided_by": request.decided_by,
            "comment": request.comment,
            "decided_at": isoformat(request.decided_at) if request.decided_at else None,
        }
        ended = replace(
            prior,
            finished_at=now,
            duration_ms=elapsed_ms(prior.started_at or now, now),
            output=output,
        )
        error: dict[str, Any] | None = None
        if request.decision == "timeout":
            seconds = getattr(step, "timeout_after", None) or 0
            error = {"type": "approval_timeout", "message": f"nobody decided within {seconds:g} s"}
        elif request.decision == "rejected" and getattr(step, "on_reject", "fail") == "fail":
            by = f" by {request.decided_by}" if request.decided_by else ""
            why = f": {request.comment}" if request.comment else ""
            error = {"type": "rejected", "message": f"rejected{by}{why}"}
        if error is not None:
            self._record(state, replace(ended, status=StepStatus.FAILED, error=error))
            state.idx += 1
            return await self._go_on(state, step, Outcome(error=error, action="fail"))
        self._record(state, replace(ended, status=StepStatus.COMPLETED))
        state.idx += 1
        # the decision is stored (in ``approvals``): found again after a crash
        return await self._go_on(state, step, Outcome(output=output), durable=True)

    async def _signalled(
        self, state: _InFlight, record: RunStep, signal: signals_store.Signal
    ) -> RunStatus | None:
        """The ``wait`` step completes with ``signal``: ``{"signal", "id", "data",
        "received_at"}``."""
        now = self._clock.now()
        output = {
            "signal": signal.name,
            "id": signal.id,
            "data": signal.data,
            "received_at": isoformat(signal.created_at),
        }
        started = record.started_at or now
        done = replace(
            record,
            status=StepStatus.COMPLETED,
            finished_at=now,
            duration_ms=elapsed_ms(started, now),
            output=output,
        )
        self._record(state, done)
        state.idx += 1
        # The signal is stored as this step's (in ``waits``): a crash before the next commit
        # finds it again, so its result needs no commit of its own.
        return await self._go_on(
            state, state.flow.steps[state.idx - 1], Outcome(output=output), durable=True
        )

    # -- flow: a step that starts a child run (and sleeps until it ends) -------------------

    async def _call(
        self, state: _InFlight, attempt: _Attempt, outcome: Outcome
    ) -> RunStatus | None:
        """A ``flow`` step reached: start the child run and, with ``wait``, sleep without a
        lease until its end wakes the run (or the step's time is up); else go on with
        ``{"run_id"}``. The child's insert and the step's record are one commit, so a crash
        never starts a second child."""
        run = state.run
        spec = outcome.output
        depth = int((run.scope or {}).get("depth", 0)) + 1
        if depth > MAX_DEPTH:
            problem = f"sub-flows nest deeper than {MAX_DEPTH} (this run is at depth {depth - 1})"
            return await self._step_failed(state, attempt, "flow_depth", problem)
        async with self._db.read() as conn:
            flow = await flows_store.get_flow(conn, run.workspace_id, run.mode, spec["flow_id"])
        if flow is None:  # another workspace's or mode's flow is not found either
            problem = f"flow {spec['flow_id']!r} not found"
            return await self._step_failed(state, attempt, "flow_not_found", problem)
        now = self._clock.now()
        child = Run(
            run_id=new_id("run"), workspace_id=run.workspace_id, mode=run.mode,
            flow_id=flow.flow_id, flow_version=flow.version, trigger="flow",
            status=RunStatus.QUEUED, payload=spec["payload"], queued_at=now,
            parent_run_id=run.run_id, parent_idx=attempt.idx,
            scope={"depth": depth, "caller": run.root_run_id or run.run_id, "tree": run.tree},
            traceparent=self._under_step(run, attempt), tree_run_id=run.tree,
        )  # fmt: skip
        async with self._db.transaction() as conn:
            # The tree's budget first: refused, nothing of this transaction is written.
            refused = await trees_store.take_child(conn, run.tree, self._max_run_tree)
            if refused is None:
                progress = self._started_child(state, attempt, outcome, child, now)
                await runs_store.insert_run(conn, child)
                [ok] = await runs_store.apply_progress(conn, [progress], owner=self._owner)
                if not ok:
                    raise runs_store.LeaseLost(run.run_id)
        if refused == "budget":
            problem = (
                f"the runs started under {run.tree} reached {self._max_run_tree}, the most "
                "one run's sub-flows may start (FLOWHOOK_MAX_RUN_TREE)"
            )
            return await self._step_failed(state, attempt, "run_tree_exhausted", problem)
        if refused is not None:
            problem = f"the runs under {run.tree} were cancelled; no run may start there"
            return await self._step_failed(state, attempt, "run_tree_cancelled", problem)
        state.pending = _Pending()
        run.status = RunStatus.RUNNING
        return RunStatus.RUNNING if spec["wait"] else None

    def _started_child(
        self, state: _InFlight, attempt: _Attempt, outcome: Outcome, child: Run, now: datetime
    ) -> runs_store.Progress:
        """The run's progress once its ``flow`` step started ``child``: with ``wait``, asleep
        in the step; else on past it with ``{"run_id"}``."""
        step, spec = attempt.step, outcome.output
        if spec["wait"]:
            output = {"run_id": child.run_id, "flow_id": child.flow_id, "until": spec["until"]}
            state.pending.steps.append(
                RunStep(
                    idx=attempt.idx, step_id=step.id, type=step.type, status=StepStatus.WAITING,
                    attempts=attempt.number, started_at=attempt.started, output=output,
                )
            )  # fmt: skip
            wake = min(outcome.wait_until or state.deadline, state.deadline)
            return self._progress(state, **_released(wake))
        done = Outcome(output={"run_id": child.run_id})
        self._record(state, attempt.record(StepStatus.COMPLETED, now, done))
        state.idx += 1
        return self._progress(state)

    @staticmethod
    def _under_step(run: Run, attempt: _Attempt) -> str:
        """The trace context of a run a step attempt starts (a child run, a part): the
        trace of ``run``, under the attempt's span."""
        span_id = tracing.step_span_id(run.run_id, attempt.idx, attempt.number)
        return tracing.child_traceparent(run.run_id, run.traceparent, span_id)

    async def _step_failed(
        self, state: _InFlight, attempt: _Attempt, type_: str, message: str
    ) -> RunStatus | None:
        """The attempt fails the step (and so the run) with ``type_`` and ``message``."""
        outcome = failure(type_, message)
        self._record(state, attempt.record(StepStatus.FAILED, self._clock.now(), outcome))
        state.idx += 1
        return await self._go_on(state, attempt.step, outcome)

    async def _wake_call(self, state: _InFlight, prior: RunStep, now: datetime) -> RunStatus | None:
        """A run sleeping in a ``flow`` step was claimed: its child ended (the step takes its
        output, or fails), the wait's time is up (the child is cancelled, the step fails), or
        it was woken early (it sleeps again, under the lock the child's end takes)."""
        run, step = state.run, state.flow.steps[state.idx]
        until = prior.output.get("until")
        deadline = min(_parse_time(until), state.deadline) if until else state.deadline
        async with self._db.transaction() as conn:
            await children_store.lock_parent(conn, run.run_id)
            child = await children_store.child_at(conn, run.run_id, state.idx)
            going = child is not None and not child.status.terminal
            if going and now < deadline:
                progress = self._progress(state, **_released(deadline))
                [ok] = await runs_store.apply_progress(conn, [progress], owner=self._owner)
                if not ok:
                    raise runs_store.LeaseLost(run.run_id)
                state.pending = _Pending()
                return RunStatus.RUNNING
            if going:  # its time is up: the child goes too
                ended = await children_store.cancel_children(conn, [run.run_id], now)
                await control_store.free_slots(conn, ended, now)
                await events_store.insert_events(conn, [cancelled_event(r, now) for r in ended])
        finished = replace(
            prior, finished_at=now, duration_ms=elapsed_ms(prior.started_at or now, now)
        )
        child_id = prior.output["run_id"]
        error: dict[str, Any] | None = None
        if child is None:
            error = {"type": "child_failed", "message": f"child run {child_id} is gone"}
        elif going:
            seconds = getattr(step, "timeout_after", None) or state.flow.timeout
            error = {
                "type": "timeout",
                "message": f"child run {child_id} did not end within {seconds:g} s; "
                "it was cancelled",
            }
        elif child.status is RunStatus.FAILED:
            why = (child.error or {}).get("message", "")
            error = {"type": "child_failed", "message": f"child run {child_id} failed: {why}"}
        elif child.status is RunStatus.CANCELLED:
            error = {"type": "child_cancelled", "message": f"child run {child_id} was cancelled"}
        if error is not None:
            error["run_id"] = child_id
            self._record(
                state, replace(finished, status=StepStatus.FAILED, output=None, error=error)
            )
            state.idx += 1
            return await self._go_on(state, step, Outcome(error=error, action="fail"))
        assert child is not None
        self._record(state, replace(finished, status=StepStatus.COMPLETED, output=child.output))
        state.idx += 1
        # the child's end is stored (its run): found again after a crash
        return await self._go_on(state, step, Outcome(output=child.output), durable=True)

    # -- parallel and map: steps that run parts side by side -----------------------------

    async def _fan(self, state: _InFlight, attempt: _Attempt, outcome: Outcome) -> RunStatus | None:
        """A ``parallel`` or ``map`` step reached: queue its parts (the first ``concurrency``
        of a map's claimable now) and sleep without a lease until the last one ends, one fails,
        or the step's time is up. The parts and the step's ``waiting`` record are one commit."""
        run, step = state.run, attempt.step
        specs: list[dict[str, Any]] = outcome.output["parts"]
        now = self._clock.now()
        if not specs:  # a map over an empty list
            self._record(state, attempt.record(StepStatus.COMPLETED, now, Outcome(output=[])))
            state.idx += 1
            return await self._go_on(state, step, Outcome(output=[]))
        under = self._under_step(run, attempt)
        parts = [
            Run(
                run_id=new_id("part"),
                workspace_id=run.workspace_id,
                mode=run.mode,
                flow_id=run.flow_id,
                flow_version=run.flow_version,
                trigger="part",
                status=RunStatus.QUEUED,
                payload={},
                queued_at=now,
                parent_run_id=run.run_id,
                parent_idx=attempt.idx,
                root_run_id=run.root_run_id or run.run_id,
                scope={
                    "step": step.id,
                    "depth": (run.scope or {}).get("depth", 0),
                    "tree": run.tree,
                    **spec,
                },
                traceparent=under,
                tree_run_id=run.tree,
            )
            for spec in specs
        ]
        released = step.concurrency if isinstance(step, MapStep) else len(parts)
        output = {"parts": len(parts), "until": outcome.output["until"]}
        state.pending.steps.append(
            RunStep(
                idx=attempt.idx, step_id=step.id, type=step.type, status=StepStatus.WAITING,
                attempts=attempt.number, started_at=attempt.started, output=output,
            )
        )  # fmt: skip
        wake = min(outcome.wait_until or state.deadline, state.deadline)
        progress = self._progress(state, **_released(wake))
        async with self._db.transaction() as conn:
            await children_store.insert_parts(conn, parts, released=released)
            [ok] = await runs_store.apply_progress(conn, [progress], owner=self._owner)
            if not ok:
                raise runs_store.LeaseLost(run.run_id)
        state.pending = _Pending()
        run.status = RunStatus.RUNNING
        return RunStatus.RUNNING

    async def _wake_fan(self, state: _InFlight, prior: RunStep, now: datetime) -> RunStatus | None:
        """A run sleeping in a ``parallel`` or ``map`` step was claimed: every part completed
        (the step's output gathers theirs), one failed (the others are stopped and the step
        fails), the step's time is up (likewise), or it was woken early (it sleeps again,
        under the lock the parts' ends take)."""
        run, step = state.run, state.flow.steps[state.idx]
        until = prior.output.get("until")
        deadline = min(_parse_time(until), state.deadline) if until else state.deadline
        async with self._db.transaction() as conn:
            await children_store.lock_parent(conn, run.run_id)
            parts = await children_store.parts_at(conn, run.run_id, state.idx)
            failed = [p for p in parts if p.status in (RunStatus.FAILED, RunStatus.CANCELLED)]
            going = any(not p.status.terminal for p in parts)
            if going and not failed and now < deadline:
                progress = self._progress(state, **_released(deadline))
                [ok] = await runs_store.apply_progress(conn, [progress], owner=self._owner)
                if not ok:
                    raise runs_store.LeaseLost(run.run_id)
                state.pending = _Pending()
                return RunStatus.RUNNING
            if going:  # the others stop (their children may hold slots)
                ended = await children_store.cancel_children(conn, [run.run_id], now, idx=state.idx)
                await control_store.free_slots(conn, ended, now)
        state.run.steps_executed += sum(p.steps_executed for p in parts)
        finished = replace(
            prior, finished_at=now, duration_ms=elapsed_ms(prior.started_at or now, now)
        )
        error: dict[str, Any] | None = None
        if failed:
            error = _part_error(failed[0])
        elif going:
            seconds = getattr(step, "timeout_after", None) or state.flow.timeout
            error = {"type": "timeout", "message": f"step took longer than {seconds:g} s"}
        if error is not None:
            self._record(
                state, replace(finished, status=StepStatus.FAILED, output=None, error=error)
            )
            state.idx += 1
            return await self._go_on(state, step, Outcome(error=error, action="fail"))
        if isinstance(step, ParallelStep):
            output: Any = {(p.scope or {}).get("branch"): p.output for p in parts}
        else:
            output = [p.output for p in parts]
        outcome = Outcome(output=output)
        _check_output(outcome, self._max_output)
        if outcome.error is not None:
            self._record(
                state, replace(finished, status=StepStatus.FAILED, output=None, error=outcome.error)
            )
            state.idx += 1
            return await self._go_on(state, step, outcome)
        self._record(state, replace(finished, status=StepStatus.COMPLETED, output=output))
        if isinstance(step, ParallelStep):
            await self._see_branches(run, {}, state.ctx, idxs=[state.idx])
        state.idx += 1
        # the parts' ends are stored (their rows): found again after a crash
        return await self._go_on(state, step, outcome, durable=True)

    def _ending(self, run: Run, status: RunStatus) -> runs_store.Progress | None:
        """What else the write that ends ``run`` does, as a ``before`` hook: wake the run
        waiting for it (a child's end; a part's, see :func:`children_store.part_ended`), and
        cancel the runs and parts it leaves (a run that fails or is cancelled while they go);
        and, as an ``after`` hook, give the concurrency slot it held to the next held run of
        its key. ``None`` when there is nothing to do."""
        parent = run.parent_run_id
        orphans = status is not RunStatus.COMPLETED
        slot = run.concurrency_slot
        if parent is None and not orphans and slot is None:
            return None
        now = self._clock.now()

        async def hook(conn: AsyncConnection) -> bool:
            if parent is not None:
                await children_store.lock_parent(conn, parent)
                if run.root_run_id is None:
                    await children_store.wake_parent(conn, parent, now)
            if slot is not None:
                await control_store.lock(conn, control_store.CONCURRENCY, run.flow_id, slot)
            if orphans:
                ended = await children_store.cancel_children(conn, [run.run_id], now)
                await control_store.free_slots(conn, ended, now)
                events = [cancelled_event(r, now) for r in ended if r.root_run_id is None]
                await events_store.insert_events(conn, events)
            return True

        async def after(conn: AsyncConnection) -> None:
            if run.root_run_id is not None:
                await children_store.part_ended(conn, run, status, now)
            if slot is not None:  # the write cleared the run's slot: it is free now
                taken, waiting = await control_store.slots_taken(conn, run.flow_id, slot)
                if waiting:
                    limit = await self._limit_now(conn, run.flow_id)
                    await control_store.give_slots(conn, run.flow_id, slot, limit - taken, now)

        if parent is not None:
            key = children_store.lock_key(parent)
        elif slot is not None:
            key = control_store.lock_key(control_store.CONCURRENCY, run.flow_id, slot)
        else:
            key = ""
        needs_after = run.root_run_id is not None or slot is not None
        return runs_store.Progress(
            run.run_id, (), before=hook, lock_key=key, after=after if needs_after else None
        )

    async def _limit_now(self, conn: AsyncConnection, flow_id: str) -> int:
        """The concurrency limit of the flow's latest version, which every admission and end
        obeys (a limit raised lets held runs go at once): no limit left lets them all go."""
        seen = self._latest.get(flow_id)
        if seen is not None and seen[1] > time.monotonic():
            version: int | None = seen[0]
        else:  # read again at most once a second: a new limit applies within that
            version = await flows_store.current_version(conn, flow_id)
            if version is not None:
                self._latest[flow_id] = (version, time.monotonic() + 1.0)
                if len(self._latest) > self._cache_size:
                    self._latest.pop(next(iter(self._latest)))
        compiled = self._flows.get((flow_id, version or 0))
        if compiled is None and version is not None:
            definition = await flows_store.get_definition(conn, flow_id, version)
            if definition is not None:
                compiled = await _build(definition)
                self._flows[(flow_id, version)] = compiled
                if len(self._flows) > self._cache_size:
                    self._flows.popitem(last=False)
        control = None if compiled is None else compiled.control
        if control is None or control.concurrency is None:
            return UNLIMITED
        return control.concurrency

    # -- finish: end the run ---------------------------------------------------------------

    async def _complete(self, state: _InFlight) -> RunStatus:
        """No step is left (or one ended the run): the flow's output, and the run completes;
        it fails when that output cannot be evaluated or stored."""
        output = None
        compiled = state.flow
        if state.run.root_run_id is not None:  # a part: the output of its last step that ran
            for step in reversed(compiled.steps):
                seen = state.ctx["steps"].get(step.id)
                if seen is not None and seen["status"] == "completed":
                    output = seen["output"]
                    break
        elif compiled.output is not None:
            try:
                output = await evaluate(compiled.output, state.ctx)
                problem = _output_problem(output, self._max_output)
            except ExpressionError as exc:
                problem = str(exc)
            if problem is not None:
                error = {"type": "expression", "message": f"flow output: {problem}", "step": None}
                return await self._finish(
                    state.run, state.pending, RunStatus.FAILED, next_step=state.idx, error=error
                )
        return await self._finish(
            state.run, state.pending, RunStatus.COMPLETED, next_step=state.idx, output=output
        )

    async def _timed_out(self, state: _InFlight, step_id: str) -> RunStatus:
        timeout = state.flow.timeout
        error = {"type": "timeout", "message": f"run exceeded {timeout:g} s", "step": step_id}
        return await self._finish(
            state.run, state.pending, RunStatus.FAILED, next_step=state.idx, error=error
        )

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
        error = {k: v for k, v in (error or {}).items() if k != "step"} or None
        failed = replace(
            step,
            status=StepStatus.FAILED,
            started_at=started,
            finished_at=now,
            duration_ms=elapsed_ms(started, now),
            output=None,
            error=error,
            interrupted=(*step.interrupted, step.attempts) if cut or crashed else step.interrupted,
        )
        pending.steps.append(failed)

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
        """End the run ``completed`` or ``failed`` with what is pending and its final event."""
        now = self._clock.now()
        duration = elapsed_ms(run.started_at or now, now)
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
        if run.root_run_id is None:  # a part's end is its step's business, not an event
            pending.events.append(_ended_event(run, status, values, now))
        changes: tuple[runs_store.StatusChange, ...] = (runs_store.StatusChange(status, values),)
        if run.status is RunStatus.QUEUED:  # started and finished in one commit
            changes = (runs_store.StatusChange(RunStatus.RUNNING, {}), *changes)
        await self._write(run, changes, pending.steps, pending.events)
        if run.root_run_id is None:
            metrics.finished(str(status)).inc()
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
        """End the run ``cancelled``; a step attempt left open fails, interrupted. A part
        keeps the results its refused write held (not the start of a next step)."""
        now = self._clock.now()
        values = {"finished_at": now, "duration_ms": run_duration_ms(run, now)}
        steps, events = self._unwritten.pop(run.run_id, ([], []))
        pending = _Pending(
            [_stopped_record(s) for s in steps if s.status is not StepStatus.RUNNING], events
        )
        stopped = {"type": "cancelled", "message": "the run was cancelled during this step"}
        self._close_open(run, pending, now, stopped, cut=True)
        cancel = runs_store.StatusChange(RunStatus.CANCELLED, values, honour_cancel=False)
        if run.root_run_id is None:
            pending.events.append(cancelled_event(run, now))
        await self._write(run, (cancel,), pending.steps, pending.events)
        if run.root_run_id is None:
            metrics.finished("cancelled").inc()
        return RunStatus.CANCELLED


def _stopped_record(step: RunStep) -> RunStep:
    """A step record kept by a part that stopped at a step boundary: a failed attempt that
    would have been retried is simply failed (the part goes no further)."""
    if step.status is StepStatus.RETRYING:
        return replace(step, status=StepStatus.FAILED)
    return step


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


def _nesting(scope: dict[str, Any]) -> dict[str, Any]:
    """Where a part's step sits: ``parent`` (the ``parallel`` or ``map`` step) and ``branch``
    or ``index``."""
    where: dict[str, Any] = {"parent": scope.get("step")}
    if "branch" in scope:
        where["branch"] = scope["branch"]
    if "index" in scope:
        where["index"] = scope["index"]
    return where


def _released(wake: datetime) -> dict[str, Any]:
    """The run's values when it is given back until ``wake``: no lease, and the lost-worker
    count starts again."""
    return {
        "available_at": wake,
        "due_at": wake,
        "lease_owner": None,
        "lease_expires_at": None,
        "claims": 0,
    }


def _ended_event(run: Run, status: RunStatus, values: dict[str, Any], now: datetime) -> Event:
    """``flow.completed`` (its payload: the flow's output when an object, then the summary) or
    ``flow.failed`` for ``run`` ending ``status`` with ``values``."""
    steps, duration = values["steps_executed"], values["duration_ms"]
    if status is RunStatus.COMPLETED:
        output = values["output"]
        payload = {
            **(output if isinstance(output, dict) else {}),
            "status": "completed",
            "steps_executed": steps,
            "duration_ms": duration,
        }
        return run_event(run, "flow.completed", payload, now)
    payload = {
        "status": "failed",
        "error": values["error"],
        "steps_executed": steps,
        "duration_ms": duration,
    }
    return run_event(run, "flow.failed", payload, now)


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
