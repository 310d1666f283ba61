"""How the engine writes a run: its progress through the (group) write, guarded by the
lease, and its end (completed, failed, cancelled) with what the end asks of the runs around
it: the run waiting for it woken, the runs it leaves cancelled, its concurrency slot given on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flowhook import tracing
from flowhook.clock import Clock
from flowhook.engine import metrics
from flowhook.engine.admission import limit_now
from flowhook.engine.compiled import FlowCache
from flowhook.engine.cursor import Pending
from flowhook.events import cancelled_event, elapsed_ms, run_duration_ms, run_event
from flowhook.store import children as children_store
from flowhook.store import control as control_store
from flowhook.store import events as events_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Event, Run, RunStatus, RunStep, StepStatus

if TYPE_CHECKING:
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["RunWriter", "ended_event"]

Apply = Callable[[runs_store.Progress], Awaitable[bool]]


class RunWriter:
    """What every run in this process's hands shares: the store, the clock, the lease owner,
    the flow versions compiled, the group write, and what is known of each run's step in
    flight."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        owner: str,
        flows: FlowCache,
        *,
        apply: Apply | None = None,
        max_output: int,
        max_run_tree: int,
        public_url: str,
    ) -> None:
        self.db = db
        self.clock = clock
        self.owner = owner
        self.flows = flows
        self.apply: Apply = apply or self._apply_alone
        """Write one run's progress, possibly in a transaction shared with other runs';
        whether its guard let it."""
        self.max_output = max_output
        self.max_run_tree = max_run_tree
        self.public_url = public_url.rstrip("/")
        self.open: dict[str, tuple[RunStep, bool]] = {}
        """Per run: its step whose ``running`` record is committed and has no outcome yet, and
        whether a crash already cut that attempt short (found so on a resumed run)."""
        self.unwritten: dict[str, tuple[list[RunStep], list[Event]]] = {}
        """Per part: the step records and events of a write its guard refused. A part whose
        sibling failed is flagged, not interrupted: its step in flight ends, and the cancel
        that follows keeps that step's result (see :meth:`lost`)."""

    async def _apply_alone(self, progress: runs_store.Progress) -> bool:
        async with self.db.transaction() as conn:
            [ok] = await runs_store.apply_progress(conn, [progress], owner=self.owner)
        return ok

    def lost(self, run: Run, steps: list[RunStep], events: list[Event]) -> runs_store.LeaseLost:
        """The error for a write of ``run`` its guard refused. A part keeps what the write
        held: when the refusal was a cancel (a sibling failed), the steps that finished before
        it are recorded as they ended, not as cut short (the others stop at their next step
        boundary)."""
        if run.root_run_id is not None:
            self.unwritten[run.run_id] = (steps, events)
        return runs_store.LeaseLost(run.run_id)

    def forget(self, run_id: str) -> None:
        self.open.pop(run_id, None)
        self.unwritten.pop(run_id, None)

    async def write(
        self,
        run: Run,
        changes: tuple[runs_store.StatusChange, ...],
        steps: list[RunStep],
        events: list[Event],
    ) -> None:
        """Write a run's progress; raises LeaseLost when the run's guard fails. A run that ends
        also does what its end asks (see :meth:`_ending`) in the same write."""
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
        if not await self.apply(progress):
            raise self.lost(run, steps, events)
        if end.terminal and tracing.ENABLED:
            tracing.run_span(run, end, changes[-1].values.get("error"), self.clock.now())

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
        now = self.clock.now()
        flows = self.flows

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
                    limit = await limit_now(flows, conn, run.flow_id)
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

    def close_open(
        self, run: Run, pending: Pending, now: datetime, error: dict[str, Any] | None, *, cut: bool
    ) -> None:
        """The run ends while a step's attempt has no outcome (its record says ``running``):
        record that step failed with ``error``. The attempt counts as interrupted when ``cut``
        or when a crash cut it."""
        found = self.open.pop(run.run_id, None)
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

    async def finish(
        self,
        run: Run,
        pending: Pending,
        status: RunStatus,
        *,
        next_step: int | None = None,
        output: Any = None,
        error: dict[str, Any] | None = None,
    ) -> RunStatus:
        """End the run ``completed`` or ``failed`` with what is pending and its final event."""
        now = self.clock.now()
        duration = elapsed_ms(run.started_at or now, now)
        self.close_open(run, pending, now, error, cut=False)
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
            pending.events.append(ended_event(run, status, values, now))
        changes: tuple[runs_store.StatusChange, ...] = (runs_store.StatusChange(status, values),)
        if run.status is RunStatus.QUEUED:  # started and finished in one commit
            changes = (runs_store.StatusChange(RunStatus.RUNNING, {}), *changes)
        await self.write(run, changes, pending.steps, pending.events)
        if run.root_run_id is None:
            metrics.finished(str(status)).inc()
        run.status = status
        return status

    async def cancel(self, run: Run) -> RunStatus:
        """End the run ``cancelled``; a step attempt left open fails, interrupted. A part
        keeps the results its refused write held (not the start of a next step)."""
        now = self.clock.now()
        values = {"finished_at": now, "duration_ms": run_duration_ms(run, now)}
        steps, events = self.unwritten.pop(run.run_id, ([], []))
        pending = Pending(
            [_stopped_record(s) for s in steps if s.status is not StepStatus.RUNNING], events
        )
        stopped = {"type": "cancelled", "message": "the run was cancelled during this step"}
        self.close_open(run, pending, now, stopped, cut=True)
        cancel = runs_store.StatusChange(RunStatus.CANCELLED, values, honour_cancel=False)
        if run.root_run_id is None:
            pending.events.append(cancelled_event(run, now))
        await self.write(run, (cancel,), pending.steps, pending.events)
        if run.root_run_id is None:
            metrics.finished("cancelled").inc()
        return RunStatus.CANCELLED


def _stopped_record(step: RunStep) -> RunStep:
    """A step record kept by a part that stopped at a step boundary: a failed attempt that
    would have been retried is simply failed (the part goes no further)."""
    if step.status is StepStatus.RETRYING:
        return replace(step, status=StepStatus.FAILED)
    return step


def ended_event(run: Run, status: RunStatus, values: dict[str, Any], now: datetime) -> Event:
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
