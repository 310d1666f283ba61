"""Flow control at a run's start: whether a flow's ``concurrency`` and ``throttle`` let a
queued run start now, decided in the group write that starts it (see
:mod:`flowhook.store.control` for the rows and locks)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from flowhook.clock import Clock
from flowhook.definition.control import FlowControl, throttle_start
from flowhook.engine import metrics
from flowhook.engine.compiled import FlowCache
from flowhook.engine.cursor import Pending
from flowhook.store import control as control_store
from flowhook.store import runs as runs_store
from flowhook.store.models import Run, RunStatus

if TYPE_CHECKING:
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["Admission", "UNLIMITED", "limit_now"]

UNLIMITED = 1_000_000
"""The slots of a key whose flow no longer caps it: every held run goes."""
_HELD_KEEPS = frozenset({"concurrency_key", "concurrency_slot", "throttle_at", "throttle_key"})
"""What a run handed back held keeps of its admission: the slot it took, the start reserved."""
_TAKING = "admitting"
"""In a transaction's scratch dict (``conn.info["tx"]``, see :class:`Database`): the slots and
starts the admissions of that transaction took, written only after every hook ran."""


async def limit_now(flows: FlowCache, conn: AsyncConnection, flow_id: str) -> int:
    """The concurrency limit of the flow's latest version, which every admission and end
    obeys (a limit raised lets held runs go at once): no limit left lets them all go."""
    compiled = await flows.latest(conn, flow_id)
    control = None if compiled is None else compiled.control
    if control is None or control.concurrency is None:
        return UNLIMITED
    return control.concurrency


@dataclass(slots=True)
class _Admitting:
    """One queued run's admission, as the ``before`` hook of the write that starts it."""

    run: Run
    control: FlowControl
    flows: FlowCache
    owner: str
    now: datetime
    values: dict[str, Any]
    """What the write sets: the run's start, and what admission took for it."""
    outcome: dict[str, str] = field(default_factory=dict)
    """``held`` (handed back, with why) or ``lost`` (its guard refused the hold)."""

    async def __call__(self, conn: AsyncConnection) -> bool:
        run, control = self.run, self.control
        taking: dict[tuple[str, str, str], Any] = conn.info.setdefault("tx", {}).setdefault(
            _TAKING, {}
        )
        if control.concurrency is not None and run.concurrency_slot is None:
            key = run.concurrency_key or ""
            await control_store.lock(conn, control_store.CONCURRENCY, run.flow_id, key)
            mine = ("c", run.flow_id, key)
            taken, waiting = await control_store.slots_taken(conn, run.flow_id, key)
            taken += taking.get(mine, 0)
            limit = await limit_now(self.flows, conn, run.flow_id)
            if taken >= limit:
                self.values["concurrency_key"] = key
                return await self._hold(conn, control_store.CONCURRENCY)
            taking[mine] = taking.get(mine, 0) + 1
            self.values["concurrency_slot"] = key
            if waiting:  # room left (the limit was raised): held runs take it too
                room = limit - taken - 1
                await control_store.give_slots(conn, run.flow_id, key, room, self.now)
        if control.throttle_limit:
            return await self._throttled(conn, taking)
        return True

    async def _throttled(self, conn: AsyncConnection, taking: dict[Any, Any]) -> bool:
        """Reserve the run's start; or, woken at the start it reserved, start only if fewer
        than ``limit`` runs of its key really started within the last period (a run that
        started late must not crowd the next window), else reserve again."""
        run, now = self.run, self.now
        key = run.throttle_key or ""
        limit, period = self.control.throttle_limit, self.control.throttle_period
        await control_store.lock(conn, control_store.THROTTLE, run.flow_id, key)
        mine: list[datetime] = taking.setdefault(("t", run.flow_id, key), [])
        since = None if run.throttle_at is None else now - timedelta(seconds=period)
        counted = await control_store.reserved_starts(
            conn, run.flow_id, key, limit, started_since=since
        )
        latest = sorted([*mine, *counted], reverse=True)[:limit]
        start = throttle_start(latest, limit, period, now)
        self.values.update(throttle_at=start, throttle_key=key)
        if start > now:  # the hold writes its reserved start now: the store counts it
            return await self._hold(conn, control_store.THROTTLE, until=start)
        mine.append(start)  # written after every hook: until then, counted here
        return True

    async def _hold(self, conn: AsyncConnection, reason: str, **how: Any) -> bool:
        kept = {k: v for k, v in self.values.items() if k in _HELD_KEEPS}
        held = await control_store.hold(
            conn, self.run.run_id, owner=self.owner, reason=reason, values=kept, **how
        )
        self.outcome["held" if held else "lost"] = reason
        return False  # nothing else of this item to write


class Admission:
    """Admits queued runs of flows with ``concurrency`` or ``throttle``: the run takes a slot
    of its key and its reserved start in the group write that starts it (``running``,
    ``flow.started``), by a ``before`` hook serialised per flow and key; or the hook hands it
    back held, with no lease, until a slot is given to it or its start comes. Admissions
    sharing a transaction count each other: the slots they take are written only after
    every hook ran."""

    def __init__(
        self,
        clock: Clock,
        owner: str,
        flows: FlowCache,
        apply: Callable[[runs_store.Progress], Awaitable[bool]],
    ) -> None:
        self._clock = clock
        self._owner = owner
        self._flows = flows
        self._apply = apply

    async def admit(self, run: Run, control: FlowControl) -> bool:
        """Whether the queued ``run`` started (else it is held); raises ``LeaseLost``."""
        now = self._clock.now()
        start = Pending()
        start.start(run, now, observe=False)
        values: dict[str, Any] = {
            **start.values, "held": None,
            "next_step": run.next_step, "steps_executed": run.steps_executed,
        }  # fmt: skip
        admitting = _Admitting(run, control, self._flows, self._owner, now, values)
        if control.concurrency is not None and run.concurrency_slot is None:
            kind, key = control_store.CONCURRENCY, run.concurrency_key or ""
        else:
            kind, key = control_store.THROTTLE, run.throttle_key or ""
        change = runs_store.StatusChange(RunStatus.RUNNING, values)
        progress = runs_store.Progress(
            run.run_id,
            (change,),
            [],
            start.events,
            before=admitting,
            lock_key=control_store.lock_key(kind, run.flow_id, key),
        )
        if not await self._apply(progress) or "lost" in admitting.outcome:
            raise runs_store.LeaseLost(run.run_id)
        if "held" in admitting.outcome:
            run.started_at = None
            metrics.RUNS_HELD.labels(reason=admitting.outcome["held"]).inc()
            return False
        metrics.START_LATENCY.observe(max(0.0, (now - run.queued_at).total_seconds()))
        run.status = RunStatus.RUNNING
        run.held = None
        run.concurrency_slot = values.get("concurrency_slot", run.concurrency_slot)
        return True
