"""Webhook endpoints: what each is (URL, chosen events, sealed secrets, flow control) and its
health (a failure window that may disable it, a rate limit's shared schedule).

An endpoint's events are rows of ``endpoint_events`` (one per chosen type), so the fan-out
(:mod:`flowhook.store.deliveries`) is a plain join on both backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import bindparam, delete, null, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.crypto import SecretBox, cipher
from flowhook.store.driver import Beside, driver_of
from flowhook.store.models import Endpoint, Mode
from flowhook.store.rows import from_row, owned, page
from flowhook.store.tables import endpoint_events, webhook_endpoints

__all__ = [
    "insert_endpoint",
    "get_endpoint",
    "list_endpoints",
    "update_endpoint",
    "delete_endpoint",
    "reserve_send",
    "mark_endpoint_health",
    "mark_endpoints_healthy",
    "healthy_beside",
]

_EP = webhook_endpoints.c


def _endpoint(row: Any, events_of: list[str], box: SecretBox) -> Endpoint:
    return from_row(
        Endpoint,
        row,
        {"mode": Mode, "enabled": bool},
        events=sorted(events_of),
        secret=box.open(row.secret),
        previous_secret=box.open(row.previous_secret) if row.previous_secret else None,
    )


async def _events_of(conn: AsyncConnection, endpoint_ids: Sequence[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {i: [] for i in endpoint_ids}
    if endpoint_ids:
        q = select(endpoint_events).where(endpoint_events.c.endpoint_id.in_(list(endpoint_ids)))
        for r in (await conn.execute(q)).all():
            found[r.endpoint_id].append(r.event)
    return found


def _endpoint_values(ep: Endpoint, box: SecretBox) -> dict[str, Any]:
    """The columns to write; secrets sealed."""
    return {
        "url": ep.url,
        "description": ep.description,
        "enabled": ep.enabled,
        "disabled_reason": ep.disabled_reason,
        "secret": box.seal(ep.secret),
        "previous_secret": box.seal(ep.previous_secret) if ep.previous_secret else None,
        "previous_secret_expires_at": ep.previous_secret_expires_at,
        "failing_since": ep.failing_since,
        "updated_at": ep.updated_at,
        "rate_limit": ep.rate_limit,
        "ordering": ep.ordering,
        "filter_flow_ids": ep.filter_flow_ids,
    }


async def insert_endpoint(conn: AsyncConnection, ep: Endpoint) -> None:
    await conn.execute(
        webhook_endpoints.insert().values(
            id=ep.id,
            workspace_id=ep.workspace_id,
            mode=str(ep.mode),
            created_at=ep.created_at,
            **_endpoint_values(ep, cipher(conn)),
        )
    )
    await conn.execute(
        endpoint_events.insert(), [{"endpoint_id": ep.id, "event": e} for e in ep.events]
    )


async def get_endpoint(
    conn: AsyncConnection,
    endpoint_id: str,
    workspace_id: str | None = None,
    mode: Mode | None = None,
) -> Endpoint | None:
    """The endpoint; scoped to a workspace and mode when they are given."""
    q = select(webhook_endpoints).where(_EP.id == endpoint_id)
    if workspace_id is not None:
        q = q.where(_EP.workspace_id == workspace_id, _EP.mode == str(mode))
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    return _endpoint(row, (await _events_of(conn, [row.id]))[row.id], cipher(conn))


async def list_endpoints(
    conn: AsyncConnection, workspace_id: str, mode: Mode, *, limit: int, after: str | None = None
) -> list[Endpoint]:
    q = page(webhook_endpoints, _EP.id, workspace_id, mode, limit=limit, after=after)
    rows = (await conn.execute(q)).all()
    chosen = await _events_of(conn, [r.id for r in rows])
    box = cipher(conn)
    return [_endpoint(r, chosen[r.id], box) for r in rows]


async def update_endpoint(conn: AsyncConnection, ep: Endpoint, *, events_changed: bool) -> None:
    await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == ep.id)
        .values(**_endpoint_values(ep, cipher(conn)))
    )
    if events_changed:
        await conn.execute(delete(endpoint_events).where(endpoint_events.c.endpoint_id == ep.id))
        await conn.execute(
            endpoint_events.insert(), [{"endpoint_id": ep.id, "event": e} for e in ep.events]
        )


async def delete_endpoint(
    conn: AsyncConnection, workspace_id: str, mode: Mode, endpoint_id: str
) -> bool:
    mine = owned(_EP.id, endpoint_id, workspace_id, mode)
    if (await conn.execute(select(_EP.id).where(mine))).first() is None:
        return False
    await conn.execute(delete(endpoint_events).where(endpoint_events.c.endpoint_id == endpoint_id))
    await conn.execute(delete(webhook_endpoints).where(mine))
    return True


async def reserve_send(conn: AsyncConnection, endpoint_id: str, now: datetime) -> datetime:
    """When a delivery to an endpoint with a ``rate_limit`` may be sent: the endpoint's next
    free time (``rate_next_at``, its row locked, so every dispatcher shares one schedule),
    which moves on by ``1 / rate_limit`` seconds; ``now`` for an endpoint without one."""
    q = select(_EP.rate_next_at, _EP.rate_limit).where(_EP.id == endpoint_id)
    row = (await conn.execute(driver_of(conn).locking(q))).first()
    if row is None or not row.rate_limit:
        return now
    slot = max(now, row.rate_next_at) if row.rate_next_at else now
    await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == endpoint_id)
        .values(rate_next_at=slot + timedelta(seconds=1.0 / float(row.rate_limit)))
    )
    return slot


async def mark_endpoints_healthy(conn: AsyncConnection, endpoint_ids: Sequence[str]) -> None:
    """Record a success for each of ``endpoint_ids``: the failure window of any that had
    one ends. One statement for all (a group commit names every endpoint it delivered to;
    one statement each was a large share of its time on PostgreSQL), locking only the
    endpoints it changes, in id order."""
    if endpoint_ids:
        await bulk.rows(conn, _healthy_statement(), {"ids": sorted(endpoint_ids)})


def healthy_beside(endpoint_ids: Sequence[str]) -> Beside:
    """:func:`mark_endpoints_healthy` as a statement to run inside a guarded update's own
    (:func:`flowhook.store.bulk.update_each`'s ``beside``)."""
    return Beside(_healthy_statement(), {"ids": sorted(endpoint_ids)})


@cache
def _healthy_statement() -> Any:
    """End the failure windows of ``ids``: the endpoints that have one are locked in id
    order first (the lock order rule: a plain ``UPDATE`` locks in the table's order)."""
    failing = (
        select(_EP.id)
        .where(_EP.id.in_(bindparam("ids", expanding=True)), _EP.failing_since.is_not(None))
        .order_by(_EP.id)
        .with_for_update(key_share=True)  # what the UPDATE takes: FOR NO KEY UPDATE
        .cte("failing")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    return (
        update(webhook_endpoints)
        .where(_EP.id.in_(select(failing.c.id)))
        .values(failing_since=null())
    )


async def mark_endpoint_health(
    conn: AsyncConnection,
    endpoint_id: str,
    *,
    succeeded: bool,
    now: datetime,
    disable_before: datetime,
) -> bool:
    """Record an outcome for the endpoint's health; ``True`` when this failure disabled it
    (nothing but failures since ``disable_before``)."""
    if succeeded:
        await mark_endpoints_healthy(conn, [endpoint_id])
        return False
    await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == endpoint_id, _EP.failing_since.is_(None))
        .values(failing_since=now)
    )
    result = await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == endpoint_id, _EP.enabled.is_(True), _EP.failing_since <= disable_before)
        .values(
            enabled=False,
            disabled_reason="disabled after failing without a success since "
            + "the failure window began; re-enable it and recover what failed",
            updated_at=now,
        )
    )
    return result.rowcount == 1
