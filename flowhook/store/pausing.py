"""Paused flows and endpoints: what they hold waits until they are resumed.

Flows: their queued runs wait, held ``paused``.

Pausing marks the flow (``flows.paused_at``) and holds every queued run of it that no worker
has taken (those flow control held back too: their hold is taken again at their start), in
one transaction; a run accepted after it is queued held (flowhook.service.runs). Runs a
worker holds go on. Resuming clears the mark and lets the held runs go oldest first, paced:
the n-th becomes due ``n / rate`` seconds after the resume, so thousands of them take their
turn beside other flows' runs instead of ahead of them.

Endpoints: their pending deliveries wait, due never (``next_attempt_at`` at
:data:`~flowhook.store.types.HELD`) but keeping when they fell due (``due_at``), so no
attempt is used and a resume sends them oldest first (a retry not yet due waits for its
time). An attempt already under way finishes. Pausing, resuming, the fan-out's queueing to a
paused endpoint (:func:`~flowhook.store.deliveries.insert_deliveries`) and the dispatcher's
:func:`put_back` all take the endpoint's lock
(:func:`~flowhook.store.deliveries.lock_endpoint`) and read whether it is paused under it:
a delivery is never held after the resume that would have let it go.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, literal, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.deliveries import DELIVERY_CHANNEL, lock_endpoint
from flowhook.store.driver import driver_of
from flowhook.store.guards import PENDING_DELIVERY, held_is
from flowhook.store.models import Held, Mode, RunStatus
from flowhook.store.rows import owned
from flowhook.store.runs import NOTIFY_CHANNEL
from flowhook.store.tables import deliveries, delivery_attempts, flows, runs, webhook_endpoints
from flowhook.store.types import HELD
from flowhook.store.wakeup import wake_at_commit

__all__ = [
    "mark",
    "hold_queued",
    "release",
    "RESUME_BATCH",
    "mark_endpoint",
    "hold_deliveries",
    "release_deliveries",
    "put_back",
]

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


_D = deliveries.c
_EP = webhook_endpoints.c


async def mark_endpoint(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    endpoint_id: str,
    paused_at: datetime | None,
) -> bool:
    """Pause the endpoint at ``paused_at`` (kept if it is paused already) or, with ``None``,
    resume it, under its lock; whether the workspace and mode own an endpoint of that id."""
    await lock_endpoint(conn, endpoint_id)
    at = literal(paused_at, _EP.paused_at.type)  # stored as the column stores its times
    value = None if paused_at is None else func.coalesce(_EP.paused_at, at)
    result = await conn.execute(
        update(webhook_endpoints)
        .where(owned(_EP.id, endpoint_id, workspace_id, mode))
        .values(paused_at=value)
    )
    return bool(result.rowcount == 1)


def _pending_of(endpoint_id: str) -> tuple[Any, ...]:
    """The endpoint's pending deliveries that are not held behind a FIFO one."""
    return (_D.endpoint_id == endpoint_id, text(PENDING_DELIVERY), _D.due_at != HELD)


async def hold_deliveries(conn: AsyncConnection, endpoint_id: str, now: datetime) -> int:
    """Hold the endpoint's pending deliveries (those under a live lease are being sent: they
    finish); how many. A lease that ran out is taken back with them, so its holder can
    neither renew it nor complete into the held row. The rows are locked first in id order,
    as claims lock them (the lock order rule). Call after :func:`mark_endpoint` paused it."""
    chosen = select(_D.id).where(
        *_pending_of(endpoint_id),
        _D.next_attempt_at != HELD,
        (_D.lease_expires_at.is_(None)) | (_D.lease_expires_at <= now),
    )
    ids = list((await conn.execute(driver_of(conn).locking(chosen.order_by(_D.id)))).scalars())
    for start in range(0, len(ids), RESUME_BATCH):
        await conn.execute(
            update(deliveries)
            .where(_D.id.in_(ids[start : start + RESUME_BATCH]), text(PENDING_DELIVERY))
            .values(next_attempt_at=HELD, lease_owner=None, lease_expires_at=None)
        )
    return len(ids)


async def release_deliveries(conn: AsyncConnection, endpoint_id: str, now: datetime) -> int:
    """Let the endpoint's held deliveries go, each due when it fell due or ``now`` if that
    has passed: claims take them oldest first. How many. Call after :func:`mark_endpoint`
    resumed it."""
    result = await conn.execute(
        update(deliveries)
        .where(*_pending_of(endpoint_id), _D.next_attempt_at == HELD)
        .values(next_attempt_at=driver_of(conn).greatest(_D.due_at, literal(now, _D.due_at.type)))
    )
    released = int(result.rowcount or 0)
    if released:
        await wake_at_commit(conn, "deliveries", DELIVERY_CHANNEL)
    return released


async def put_back(
    conn: AsyncConnection, delivery_id: str, endpoint_id: str, number: int, owner: str
) -> bool:
    """A dispatcher claimed a delivery whose endpoint it read paused (queued or made due
    while the pause was on its way): hold it again as if never claimed (its attempt uncounted
    and its line gone), if the endpoint is still paused under its lock. ``False``: it was
    resumed meanwhile, and the attempt goes ahead."""
    await lock_endpoint(conn, endpoint_id)
    paused = select(_EP.paused_at).where(_EP.id == endpoint_id)
    if (await conn.execute(paused)).scalar() is None:
        return False
    held = await conn.execute(
        update(deliveries)
        .where(_D.id == delivery_id, _D.lease_owner == owner, text(PENDING_DELIVERY))
        .values(
            attempts=_D.attempts - 1,
            next_attempt_at=HELD,
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    if held.rowcount == 1:
        A = delivery_attempts.c
        await conn.execute(
            delete(delivery_attempts).where(
                A.delivery_id == delivery_id, A.number == number, A.finished_at.is_(None)
            )
        )
    return True
