"""Events: the outbox. Each is written in the transaction of the change that raised it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.ids import new_id
from flowhook.store import bulk
from flowhook.store import webhooks as webhooks_store
from flowhook.store.models import Delivery, Event, Mode
from flowhook.store.rows import owned, page
from flowhook.store.tables import events

__all__ = ["insert_events", "list_events_for_run", "list_events", "get_event"]


async def insert_events(
    conn: AsyncConnection, batch: Sequence[Event], *, to_endpoint: str | None = None
) -> int:
    """Write events and, in the same transaction, one delivery per enabled endpoint of the
    event's workspace and mode that chose its type (the outbox's fan-out). A batch may mix
    workspaces and modes (the engine's group commit): one statement writes the events, one
    query per workspace and mode finds the subscribers, one statement queues the deliveries.
    Returns the number of deliveries queued."""
    if not batch:
        return 0
    await bulk.insert(conn, events, [e.to_row() for e in batch])
    if to_endpoint is not None:  # a test event: to that endpoint alone
        queued = [Delivery.queued(new_id("dlv"), e, to_endpoint) for e in batch]
        await webhooks_store.insert_deliveries(conn, queued)
        return len(queued)
    targets: dict[tuple[str, Mode, str], list[webhooks_store.Subscriber]] = {}
    tenants: dict[tuple[str, Mode], set[str]] = {}
    for e in batch:
        tenants.setdefault((e.workspace_id, e.mode), set()).add(e.type)
    for (workspace_id, mode), types in tenants.items():
        for found in await webhooks_store.subscribers(conn, workspace_id, mode, sorted(types)):
            targets.setdefault((workspace_id, mode, found.event), []).append(found)
    if not targets:
        return 0
    queued = [
        Delivery.queued(new_id("dlv"), e, sub.endpoint_id)
        for e in batch
        for sub in targets.get((e.workspace_id, e.mode, e.type), ())
        if sub.wants(e.flow_id)  # an endpoint's filter.flow_ids
    ]
    fifo = sorted({s.endpoint_id for subs in targets.values() for s in subs if s.fifo})
    await webhooks_store.insert_deliveries(conn, queued, fifo=fifo)
    return len(queued)


async def list_events_for_run(conn: AsyncConnection, run_id: str) -> list[Event]:
    q = select(events).where(events.c.run_id == run_id).order_by(events.c.id)
    return [Event.from_row(r) for r in (await conn.execute(q)).all()]


async def list_events(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    *,
    limit: int,
    after: str | None = None,
    event_type: str | None = None,
    run_id: str | None = None,
) -> list[Event]:
    q = page(
        events, events.c.id, workspace_id, mode, limit=limit, after=after,
        type=event_type, run_id=run_id,
    )  # fmt: skip
    return [Event.from_row(r) for r in (await conn.execute(q)).all()]


async def get_event(
    conn: AsyncConnection, workspace_id: str, mode: Mode, event_id: str
) -> Event | None:
    q = select(events).where(owned(events.c.id, event_id, workspace_id, mode))
    row = (await conn.execute(q)).first()
    return Event.from_row(row) if row else None
