"""Schedules: start runs of a flow on a cron, with trigger ``schedule``.

Exactly one run per tick, however many processes run the scheduler: claiming a tick is a
guarded move of ``next_run_at``, and the run carries the idempotency key
``schedule:<id>:<tick>``, unique per workspace and mode. Ticks missed while no scheduler ran
(more than ``MISSED_AFTER`` late) are skipped and logged, not run in a burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

from flowhook.clock import Clock
from flowhook.cron import check_cron, check_timezone, next_tick, shortest_gap
from flowhook.definition.input_schema import payload_problems
from flowhook.errors import Duplicate, InvalidInput
from flowhook.ids import new_id
from flowhook.service.auth import Principal
from flowhook.service.jsonvalues import check_json
from flowhook.service.lookup import find, missing
from flowhook.service.pagination import Page, listed
from flowhook.store import flows as flows_store
from flowhook.store import runs as runs_store
from flowhook.store import schedules as store
from flowhook.store.db import Database
from flowhook.store.models import Run, RunStatus
from flowhook.store.schedules import Schedule

__all__ = ["ScheduleService", "MISSED_AFTER"]

log = logging.getLogger("flowhook.schedules")
MISSED_AFTER = timedelta(seconds=60)


def _validated(cron: str, timezone: str, min_seconds: int) -> str:
    try:
        check_timezone(timezone)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="timezone") from None
    try:
        cron = check_cron(cron)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="cron") from None
    gap = shortest_gap(cron)
    if gap < min_seconds:
        raise InvalidInput(
            f"the cron expression {cron!r} can fire {gap} s apart; schedules here must leave "
            f"at least {min_seconds} s between ticks",
            field="cron",
        )
    return cron


class ScheduleService:
    def __init__(
        self, db: Database, clock: Clock, *, min_seconds: int = 60, max_per_workspace: int = 100
    ) -> None:
        self._db = db
        self._clock = clock
        self._min_seconds = min_seconds
        self._max = max_per_workspace

    async def create(
        self, who: Principal, *, flow_id: str, cron: str, timezone: str = "UTC",
        payload: dict[str, Any] | None = None, enabled: bool = True,
    ) -> Schedule:  # fmt: skip
        cron = _validated(cron, timezone, self._min_seconds)
        check_json(payload, "payload")
        now = self._clock.now()
        async with self._db.transaction() as conn:
            if await flows_store.get_flow(conn, who.workspace_id, who.mode, flow_id) is None:
                raise missing("flow", flow_id)
            if await store.count_schedules(conn, who.workspace_id, who.mode) >= self._max:
                raise InvalidInput(
                    f"this workspace has {self._max} schedules in {who.mode} mode, the most "
                    "allowed; delete one first",
                    code="too_many_schedules",
                )
            schedule = Schedule(
                new_id("sch"), who.workspace_id, who.mode, flow_id, cron, timezone, payload or {},
                enabled, next_tick(cron, timezone, now), now, now,
            )  # fmt: skip
            await store.insert_schedule(conn, schedule)
        return schedule

    async def get(self, who: Principal, schedule_id: str) -> Schedule:
        return await find(
            self._db, "schedule", "sch", schedule_id,
            lambda conn: store.get_schedule(conn, who.workspace_id, who.mode, schedule_id),
        )  # fmt: skip

    async def list(self, who: Principal, *, limit: int, cursor: str | None) -> Page[Schedule]:
        return await listed(
            self._db, "sch", limit=limit, cursor=cursor, cursor_of=lambda row: row.id,
            fetch=lambda conn, after, n: store.list_schedules(
                conn, who.workspace_id, who.mode, limit=n, after=after
            ),
        )  # fmt: skip

    async def update(self, who: Principal, schedule_id: str, changes: dict[str, Any]) -> Schedule:
        s = await self.get(who, schedule_id)
        if changes.get("cron") or changes.get("timezone"):
            # Only a new cron or zone is checked: a schedule made under looser limits can
            # still be paused or given another payload.
            s.cron = changes.get("cron") or s.cron
            s.timezone = changes.get("timezone") or s.timezone
            s.cron = _validated(s.cron, s.timezone, self._min_seconds)
        check_json(changes.get("payload"), "payload")
        if changes.get("payload") is not None:
            s.payload = changes["payload"]
        if changes.get("enabled") is not None:
            s.enabled = bool(changes["enabled"])
        now = self._clock.now()
        s.next_run_at = next_tick(s.cron, s.timezone, now)
        s.updated_at = now
        async with self._db.transaction() as conn:
            await store.save_schedule(conn, s)
        return s

    async def delete(self, who: Principal, schedule_id: str) -> None:
        async with self._db.transaction() as conn:
            if not await store.delete_schedule(conn, who.workspace_id, who.mode, schedule_id):
                raise missing("schedule", schedule_id)

    async def tick(self) -> int:
        """Start the runs of every due tick; how many were started by this call."""
        now = self._clock.now()
        async with self._db.read() as conn:
            due = await store.due_schedules(conn, now)
        started = 0
        for s in due:
            with contextlib.suppress(Duplicate):  # another process started it
                started += await self._fire(s, now)
        return started

    async def run_forever(self, stopping: asyncio.Event) -> None:
        """The scheduler loop: fire due ticks, then sleep until the next one (at most 1 s, so
        new schedules are seen quickly)."""
        while not stopping.is_set():
            pause = 1.0
            try:
                await self.tick()
                async with self._db.read() as conn:
                    upcoming = await store.next_due(conn)
                if upcoming is not None:
                    pause = min(1.0, max(0.01, (upcoming - self._clock.now()).total_seconds()))
            except Exception:
                log.exception("scheduler: tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), pause)

    async def _fire(self, s: Schedule, now: Any) -> int:
        tick = s.next_run_at
        following = next_tick(s.cron, s.timezone, max(tick, now - MISSED_AFTER))
        late = now - tick > MISSED_AFTER
        if late:
            following = next_tick(s.cron, s.timezone, now)
        async with self._db.transaction() as conn:
            if not await store.advance(conn, s.id, tick=tick, to=following):
                return 0  # another scheduler claimed this tick
            if late:
                log.warning(
                    "schedule %s: ticks from %s to %s were missed while no scheduler ran; skipped",
                    s.id,
                    tick,
                    now,
                )
                return 0
            flow = await flows_store.get_flow(conn, s.workspace_id, s.mode, s.flow_id)
            if flow is None:
                log.warning(
                    "schedule %s: flow %s is archived; tick %s skipped", s.id, s.flow_id, tick
                )
                return 0
            schema = flow.definition.get("input_schema")
            wrong = (
                payload_problems(flow.flow_id, flow.version, schema, s.payload, limit=3)
                if schema is not None
                else []
            )
            if wrong:  # the tick is used up: the next one tries again (the flow may change)
                log.warning(
                    "schedule %s: its payload does not match the input_schema of flow %s (%s); "
                    "tick %s skipped",
                    s.id,
                    s.flow_id,
                    "; ".join(f"{field}: {message}" for field, message in wrong),
                    tick,
                )
                return 0
            run = Run(
                run_id=new_id("run"), workspace_id=s.workspace_id, mode=s.mode, flow_id=s.flow_id,
                flow_version=flow.version, trigger="schedule", status=RunStatus.QUEUED,
                payload={**s.payload}, queued_at=now,
            )  # fmt: skip
            await runs_store.insert_run(
                conn, run, idempotency_key=f"schedule:{s.id}:{tick.isoformat()}"
            )
        return 1
