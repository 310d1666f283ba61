"""Events: the outbox. Each is written in the transaction of the change that raised it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.ids import new_id
from flowhook.store import bulk
from flowhook.store import webhooks as webhooks_store
from flowhook.store.models import Event, Mode
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
    await bulk.insert(
        conn,
        events,
        [
            {
                "id": e.id,
                "workspace_id": e.workspace_id,
                "mode": str(e.mode),
                "type": e.type,
                "flow_id": e.flow_id,
                "run_id": e.run_id,
                "created_at": e.created_at,
                "body": e.body,
            }
            for e in batch
        ],
    )
    targets: dict[tuple[str, Mode, str], list[str]] = {}
    if to_endpoint is not None:  # a test event: to that endpoint alone
        for e in batch:
            targets[(e.workspace_id, e.mode, e.type)] = [to_endpoint]
    else:
        tenants: dict[tuple[str, Mode], set[str]] = {}
        for e in batch:
            tenants.setdefault((e.workspace_id, e.mode), set()).add(e.type)
        for (workspace_id, mode), types in tenants.items():
            found = await webhooks_store.subscribers(conn, workspace_id, mode, sorted(types))
            for endpoint_id, event_type in found:
                targets.setdefault((workspace_id, mode, event_type), []).append(endpoint_id)
    if not targets:
        return 0
    rows = [
        {
            "id": new_id("dlv"),
            "event_id": e.id,
            "endpoint_id": endpoint_id,
            "workspace_id": e.workspace_id,
            "mode": str(e.mode),
            "event_type": e.type,
            "run_id": e.run_id,
            "status": "pending",
            "attempts": 0,
            "next_attempt_at": e.created_at,
            "created_at": e.created_at,
        }
        for e in batch
        for endpoint_id in targets.get((e.workspace_id, e.mode, e.type), ())
    ]
    await webhooks_store.insert_deliveries(conn, rows)
    return len(rows)


def _event(row: Any) -> Event:
    return Event(
        id=row.id,
        workspace_id=row.workspace_id,
        mode=Mode(row.mode),
        type=row.type,
        flow_id=row.flow_id,
        run_id=row.run_id,
        created_at=row.created_at,
        body=bytes(row.body),
    )


async def list_events_for_run(conn: AsyncConnection, run_id: str) -> list[Event]:
    q = select(events).where(events.c.run_id == run_id).order_by(events.c.id)
    return [_event(r) for r in (await conn.execute(q)).all()]


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
    q = (
        select(events)
        .where(events.c.workspace_id == workspace_id, events.c.mode == str(mode))
        .order_by(events.c.id.desc())
        .limit(limit)
    )
    if after is not None:
        q = q.where(events.c.id < after)
    if event_type is not None:
        q = q.where(events.c.type == event_type)
    if run_id is not None:
        q = q.where(events.c.run_id == run_id)
    return [_event(r) for r in (await conn.execute(q)).all()]


async def get_event(
    conn: AsyncConnection, workspace_id: str, mode: Mode, event_id: str
) -> Event | None:
    q = select(events).where(
        events.c.id == event_id, events.c.workspace_id == workspace_id, events.c.mode == str(mode)
    )
    row = (await conn.execute(q)).first()
    return _event(row) if row else None
