"""Paused flows: their queued runs wait, held ``paused``, until the flow is resumed.

Pausing marks the flow (``flows.paused_at``) and holds every queued run of it that no worker
has taken (those flow control held back too: their hold is taken again at their start), in
one transaction; a run accepted after it is queued held (flowhook.service.runs). Runs a
worker holds go on. Resuming clears the mark and lets the held runs go oldest first, paced:
the n-th becomes due ``n / rate`` seconds after the resume, so thousands of them take their
turn beside other flows' runs instead of ahead of them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.guards import held_is
from flowhook.store.models import Held, Mode, RunStatus
from flowhook.store.rows import owned
from flowhook.store.runs import NOTIFY_CHANNEL
from flowhook.store.tables import flows, runs
from flowhook.store.types import HELD
from flowhook.store.wakeup import wake_at_commit

__all__ = ["mark", "hold_queued", "release", "RESUME_BATCH"]

RESUME_BATCH = 1000
"""Held runs let go per statement on resume."""


async def mark(
    conn: AsyncConnection, workspace_id: str, mode: Mode, flow_id: str, paused_at: datetime | None
) -> bool:
    """Set (or, with ``None``, clear) the flow's pause; whether the workspace and mode own a
    flow of that id that is not archived."""
    result = await conn.execute(
        update(flows)
        .where(owned(flows.c.flow_id, flow_id, workspace_id, mode), flows.c.archived_at.is_(None))
        .values(paused_at=paused_at)
    )
    return bool(result.rowcount == 1)


async def hold_queued(conn: AsyncConnection, flow_id: str) -> int:
    """Hold every queued run of the flow that no worker holds (flow control's holds
    included); how many."""
    result = await conn.execute(
        update(runs)
        .where(
            runs.c.flow_id == flow_id,
            runs.c.status == str(RunStatus.QUEUED),
            runs.c.lease_owner.is_(None),
            runs.c.concurrency_slot.is_(None),
            runs.c.held.is_distinct_from(str(Held.PAUSED)),
        )
        .values(held=str(Held.PAUSED), available_at=HELD, due_at=HELD)
    )
    return int(result.rowcount or 0)


async def release(conn: AsyncConnection, flow_id: str, now: datetime, rate: float) -> int:
    """Let the flow's held runs go, oldest first, the n-th due ``n / rate`` s from ``now``;
    how many."""
    oldest = (
        select(runs.c.run_id)
        .where(
            runs.c.flow_id == flow_id,
            text(held_is(Held.PAUSED, "runs")),
            runs.c.status == str(RunStatus.QUEUED),
        )
        .order_by(runs.c.queued_at, runs.c.run_id)
    )
    ids = list((await conn.execute(oldest)).scalars())
    for start in range(0, len(ids), RESUME_BATCH):
        rows: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for n, run_id in enumerate(ids[start : start + RESUME_BATCH], start):
            due = now + timedelta(seconds=n / rate)
            rows.append(({"held": None, "available_at": due, "due_at": due}, {"run_id": run_id}))
        await bulk.update(conn, runs, rows)
    if ids:
        await wake_at_commit(conn, "runs", NOTIFY_CHANNEL)
    return len(ids)
