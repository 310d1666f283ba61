"""``wait``: the run sleeps, holding no worker, until a signal of ``signal``'s name whose data
matches every ``match`` field arrives (or one sent to the run itself), or until
``timeout_seconds`` pass (``on_timeout``: ``fail`` with error type ``wait_timeout``, or
``continue`` with output ``null``). The step evaluates what it waits for; its durable half
parks the run (registering the wait) and wakes it (by the signal, or when its time is up)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Action, Context, Outcome, StepBase, StepEnv, error
from flowhook.engine.steps.delay import parse_time
from flowhook.events import elapsed_ms
from flowhook.store import signals as signals_store
from flowhook.store.models import RunStatus, RunStep, StepStatus
from flowhook.store.signals import Signal, Wait

if TYPE_CHECKING:
    from flowhook.engine.durable import Attempt, Cursor
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["WaitStep", "SignalStore"]


class SignalStore(Protocol):
    """What a ``wait`` step reads and writes of signals (:mod:`flowhook.store.signals`)."""

    async def lock_name(
        self, conn: AsyncConnection, workspace_id: str, mode: str, name: str
    ) -> None: ...
    async def find_for_wait(
        self, conn: AsyncConnection, wait: Wait, since: datetime
    ) -> Signal | None: ...
    async def register_wait(
        self, conn: AsyncConnection, wait: Wait, *, resolved_by: Signal | None = None, now: datetime
    ) -> None: ...
    async def taken(self, conn: AsyncConnection, run_id: str, idx: int) -> Signal | None: ...
    async def resolve_wait(
        self, conn: AsyncConnection, run_id: str, idx: int, now: datetime
    ) -> tuple[bool, Signal | None]: ...


class WaitStep(StepBase, kind="wait", pure=False, external=False, limited=False):
    store: SignalStore = signals_store

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.signal: str = spec["signal"]
        self._match = compile_value(spec.get("match", {}))
        self.timeout_after: float | None = spec.get("timeout_seconds")
        self.on_timeout: str = spec.get("on_timeout", "fail")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """What the run waits for: ``{"signal", "match", "until"}``, suspending it."""
        try:
            match = await evaluate(self._match, ctx)
        except ExpressionError as exc:
            return error("expression", f"match: {exc}")
        if not isinstance(match, dict):
            return error("expression", "match must evaluate to an object")
        now = env.clock.now()
        until = None if self.timeout_after is None else now + timedelta(seconds=self.timeout_after)
        output = {
            "signal": self.signal,
            "match": match,
            "until": isoformat(until) if until is not None else None,
        }
        return Outcome(output=output, action=Action.SUSPEND, wait_until=until)

    async def park(self, cur: Cursor, attempt: Attempt, outcome: Outcome) -> RunStatus | None:
        """Take the signal that matches if one came since the run was queued, else sleep
        without a lease until one comes (it wakes the run) or the step's time is up. The
        lookup, the registration and the release are one write under the signal name's lock,
        so a signal sent meanwhile is never missed; that write is the group write the run's
        other progress goes through, so parks share commits."""
        run, store = cur.run, self.store
        wait = Wait(
            run.run_id, attempt.idx, run.workspace_id, run.mode, self.signal,
            outcome.output["match"], attempt.started, outcome.wait_until, run.root_run_id,
        )  # fmt: skip
        record = attempt.waiting(outcome.output)
        found: list[Signal | None] = [None]

        async def look(conn: AsyncConnection) -> bool:
            """In the (group) write: the signal, or the run's release to sleep (True)."""
            await store.lock_name(conn, run.workspace_id, run.mode, self.signal)
            found[0] = await store.find_for_wait(conn, wait, run.queued_at)
            await store.register_wait(conn, wait, resolved_by=found[0], now=cur.now())
            return found[0] is None

        cur.add(record)
        wake = min(outcome.wait_until or cur.deadline, cur.deadline)
        progress = replace(
            cur.progress(wake=wake),
            before=look,
            lock_key=f"signal:{run.workspace_id}:{run.mode}:{self.signal}",
        )
        await cur.apply(progress)
        if found[0] is not None:  # nothing pending was written: it goes on with the signal
            cur.pending.steps.pop()
            return await self._signalled(cur, record, found[0])
        cur.written()
        return RunStatus.RUNNING

    async def wake(self, cur: Cursor, prior: RunStep, now: datetime) -> RunStatus | None:
        """Resumed by a signal, timed out (what ``on_timeout`` says), or woken early (it
        sleeps again)."""
        run, store = cur.run, self.store
        name = prior.output["signal"]
        # Most wake-ups are by a signal, which a read finds: no lock and no write for it.
        async with cur.read() as conn:
            signal = await store.taken(conn, run.run_id, cur.idx)
        done = signal is not None
        if signal is None:
            async with cur.transaction() as conn:
                await store.lock_name(conn, run.workspace_id, run.mode, name)
                done, signal = await store.resolve_wait(conn, run.run_id, cur.idx, now)
        if signal is not None:
            return await self._signalled(cur, prior, signal)
        if not done:
            until = prior.output.get("until")
            return await cur.sleep_until(
                min(parse_time(until), cur.deadline) if until else cur.deadline
            )
        ended = replace(
            prior,
            finished_at=now,
            duration_ms=elapsed_ms(prior.started_at or now, now),
            output=None,
        )
        if self.on_timeout == "continue":
            return await cur.done(self, replace(ended, status=StepStatus.COMPLETED), Outcome())
        seconds = self.timeout_after or 0
        error = {"type": "wait_timeout", "message": f"no signal {name!r} came within {seconds:g} s"}
        failed = replace(ended, status=StepStatus.FAILED, error=error)
        return await cur.done(self, failed, Outcome(error=error, action=Action.FAIL))

    async def _signalled(self, cur: Cursor, record: RunStep, signal: Signal) -> RunStatus | None:
        """The step completes with ``signal``: ``{"signal", "id", "data", "received_at"}``."""
        now = cur.now()
        output = {
            "signal": signal.name,
            "id": signal.id,
            "data": signal.data,
            "received_at": isoformat(signal.created_at),
        }
        done = replace(
            record,
            status=StepStatus.COMPLETED,
            finished_at=now,
            duration_ms=elapsed_ms(record.started_at or now, now),
            output=output,
        )
        # The signal is stored as this step's (in ``waits``): a crash before the next commit
        # finds it again, so its result needs no commit of its own.
        return await cur.done(self, done, Outcome(output=output), durable=True)
