"""Reads of deliveries and their attempt logs: the API's lists and pages, a recovery's
failed deliveries, the metrics' oldest pending one, the endpoints' counts."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, exists, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import aliased

from flowhook.store.guards import PENDING_DELIVERY
from flowhook.store.models import Attempt, Delivery, DeliveryStatus, Mode
from flowhook.store.rows import owned, page
from flowhook.store.tables import deliveries, delivery_attempts, events, webhook_endpoints
from flowhook.store.types import HELD

__all__ = [
    "get_delivery",
    "explain_held",
    "list_deliveries",
    "failed_deliveries_between",
    "events_in_hand",
    "oldest_pending",
    "endpoint_stats",
    "delivered_later",
    "delivered_since",
]

_D = deliveries.c


async def get_delivery(
    conn: AsyncConnection, workspace_id: str, mode: Mode, delivery_id: str
) -> Delivery | None:
    q = select(deliveries).where(owned(_D.id, delivery_id, workspace_id, mode))
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    found = Delivery.from_row(row)
    attempts_q = (
        select(delivery_attempts)
        .where(delivery_attempts.c.delivery_id == delivery_id)
        .order_by(delivery_attempts.c.number)
    )
    found.attempt_log = [Attempt.from_row(a) for a in (await conn.execute(attempts_q)).all()]
    await explain_held(conn, [found])
    return found


async def list_deliveries(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    *,
    limit: int,
    after: str | None = None,
    status: DeliveryStatus | None = None,
    endpoint_id: str | None = None,
    event_type: str | None = None,
    run_id: str | None = None,
) -> list[Delivery]:
    equal: dict[str, Any] = {"status": status, "endpoint_id": endpoint_id, "event_type": event_type}
    if run_id is None:
        q = page(deliveries, _D.id, workspace_id, mode, limit=limit, after=after, **equal)
    else:
        q = _of_run(workspace_id, mode, run_id, limit=limit, after=after, **equal)
    found = [Delivery.from_row(r) for r in (await conn.execute(q)).all()]
    await explain_held(conn, found)
    return found


async def explain_held(conn: AsyncConnection, found: Sequence[Delivery]) -> None:
    """Say why each held delivery of ``found`` waits (:attr:`Delivery.waiting_for`): its
    endpoint is paused (``{"reason": "paused", "since"}``), or it is FIFO and the delivery
    ahead of it goes first (``{"reason": "fifo", "delivery_id"}``). Two small reads, and
    only when one of ``found`` is held."""
    held = [d for d in found if d.status is DeliveryStatus.PENDING and d.next_attempt_at >= HELD]
    if not held:
        return
    ids = sorted({d.endpoint_id for d in held})
    q = select(webhook_endpoints.c.id, webhook_endpoints.c.paused_at).where(
        webhook_endpoints.c.id.in_(ids), webhook_endpoints.c.paused_at.is_not(None)
    )
    paused = {ep: at for ep, at in (await conn.execute(q)).all()}
    followers = [d for d in held if d.endpoint_id not in paused and d.due_at == HELD]
    ahead: dict[str, str] = {}
    for endpoint_id in sorted({d.endpoint_id for d in followers}):
        # the FIFO endpoint's delivery that goes first: pending and not held behind another
        q = (
            select(_D.id)
            .where(_D.endpoint_id == endpoint_id, text(PENDING_DELIVERY), _D.due_at != HELD)
            .order_by(_D.due_at)
            .limit(1)
        )
        first = (await conn.execute(q)).scalar()
        if first is not None:
            ahead[endpoint_id] = str(first)
    for d in held:
        if d.endpoint_id in paused:
            d.waiting_for = {"reason": "paused", "since": paused[d.endpoint_id]}
        elif d.due_at == HELD:
            d.waiting_for = {"reason": "fifo", "delivery_id": ahead.get(d.endpoint_id)}
        # else: held for an endpoint resumed since this read began: it goes now


async def due_times(conn: AsyncConnection, delivery_id: str) -> tuple[datetime, datetime] | None:
    """A delivery's ``next_attempt_at`` and ``due_at`` as stored."""
    q = select(_D.next_attempt_at, _D.due_at).where(_D.id == delivery_id)
    row = (await conn.execute(q)).first()
    return None if row is None else (row[0], row[1])


def _of_run(
    workspace_id: str, mode: Mode, run_id: str, *, limit: int, after: str | None, **equal: Any
) -> Any:
    """:func:`list_deliveries` of one run: as :func:`page` would read them, but found through
    the run's events (a delivery's run is its event's; there is no index on run_id). The
    workspace is compared as ``coalesce(workspace_id, workspace_id)`` so that no index serves
    it (an expression, of the same type: ``|| ''`` made a packed id text): SQLite, which
    has no statistics to choose by, would otherwise read the workspace's deliveries newest
    first (the ORDER BY's index) down to the run's, every one of them for an old run."""
    q = (
        select(deliveries)
        .where(
            _D.event_id.in_(select(events.c.id).where(events.c.run_id == run_id)),
            _D.run_id == run_id,
            func.coalesce(_D.workspace_id, _D.workspace_id) == workspace_id,
            _D.mode == mode.value,
        )
        .order_by(_D.id.desc())
        .limit(limit)
    )
    if after is not None:
        q = q.where(_D.id < after)
    for name, value in equal.items():
        if value is not None:
            q = q.where(_D[name] == (value.value if isinstance(value, enum.Enum) else value))
    return q


async def failed_deliveries_between(
    conn: AsyncConnection,
    endpoint_id: str,
    since: datetime,
    until: datetime,
    *,
    after: str | None = None,
    limit: int = 200,
) -> list[Delivery]:
    """The endpoint's failed deliveries created in [since, until], by id, after ``after``."""
    q = (
        select(deliveries)
        .where(
            _D.endpoint_id == endpoint_id,
            _D.status == str(DeliveryStatus.FAILED),
            _D.created_at >= since,
            _D.created_at <= until,
        )
        .order_by(_D.id)
        .limit(limit)
    )
    if after is not None:
        q = q.where(_D.id > after)
    return [Delivery.from_row(r) for r in (await conn.execute(q)).all()]


async def events_in_hand(conn: AsyncConnection, endpoint_id: str, event_ids: set[str]) -> set[str]:
    """Which of ``event_ids`` have a delivery to the endpoint that did not fail (sent or
    on its way), so recovering them again would send them twice."""
    if not event_ids:
        return set()
    q = select(_D.event_id).where(
        _D.endpoint_id == endpoint_id,
        _D.event_id.in_(sorted(event_ids)),
        _D.status != str(DeliveryStatus.FAILED),
    )
    return set((await conn.execute(q)).scalars())


async def oldest_pending(conn: AsyncConnection) -> datetime | None:
    """When the oldest delivery still pending was created (for the age metric)."""
    value = (
        await conn.execute(
            select(func.min(_D.created_at)).where(_D.status == str(DeliveryStatus.PENDING))
        )
    ).scalar_one_or_none()
    assert value is None or isinstance(value, datetime)
    return value


def delivered_since(table: Any = deliveries) -> ColumnElement[bool]:
    """True for a delivery of ``table`` whose event a later delivery (a replay, a
    recovery) brought to the same endpoint: it failed, but its event got through. One probe
    of the event's deliveries (``ix_deliveries_event_id``)."""
    later = aliased(deliveries, name="later")
    return exists().where(
        later.c.event_id == table.c.event_id,
        later.c.endpoint_id == table.c.endpoint_id,
        later.c.status == str(DeliveryStatus.SUCCEEDED),
    )


async def delivered_later(conn: AsyncConnection, failed: Sequence[Delivery]) -> dict[str, str]:
    """For each of the ``failed`` deliveries whose event a later delivery brought to the
    same endpoint, that delivery's id (one read for a page of them)."""
    wanted = {(d.event_id, d.endpoint_id): d.id for d in failed}
    if not wanted:
        return {}
    first = failed[0]
    q = select(_D.id, _D.event_id, _D.endpoint_id).where(
        _D.event_id.in_(sorted({event_id for event_id, _ in wanted})),
        _D.status == str(DeliveryStatus.SUCCEEDED),
        _D.workspace_id == first.workspace_id,  # (the events are the caller's already)
        _D.mode == first.mode.value,
    )
    found: dict[str, str] = {}
    for row in (await conn.execute(q)).all():
        original = wanted.get((row.event_id, row.endpoint_id))
        if original is not None:
            found[original] = row.id
    return found


async def endpoint_stats(
    conn: AsyncConnection, endpoint_ids: Sequence[str], since: datetime
) -> dict[str, dict[str, int]]:
    """Deliveries per endpoint and status created since ``since``. A failed delivery whose
    event a later one delivered (a replay) counts as ``redelivered``, not ``failed``: the
    event got through."""
    stats: dict[str, dict[str, int]] = {i: {} for i in endpoint_ids}
    if not endpoint_ids:
        return stats
    window = (_D.endpoint_id.in_(list(endpoint_ids)), _D.created_at >= since)
    q = (
        select(_D.endpoint_id, _D.status, func.count())
        .where(*window)
        .group_by(_D.endpoint_id, _D.status)
    )
    for endpoint_id, status, n in (await conn.execute(q)).all():
        stats[endpoint_id][status] = int(n)
    failed = [i for i in endpoint_ids if stats[i].get(str(DeliveryStatus.FAILED))]
    if failed:  # only where something failed: usually nowhere
        q = (
            select(_D.endpoint_id, func.count())
            .where(
                _D.endpoint_id.in_(failed),
                _D.created_at >= since,
                _D.status == str(DeliveryStatus.FAILED),
                delivered_since(),
            )
            .group_by(_D.endpoint_id)
        )
        for endpoint_id, n in (await conn.execute(q)).all():
            # (two reads: a delivery that failed between them is not counted twice)
            failures = stats[endpoint_id][str(DeliveryStatus.FAILED)]
            stats[endpoint_id][str(DeliveryStatus.FAILED)] = max(0, failures - int(n))
            stats[endpoint_id]["redelivered"] = min(failures, int(n))
    return stats
