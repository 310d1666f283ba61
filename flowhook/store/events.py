"""Events: the outbox. Each is written in the transaction of the change that raised it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.models import Event, Mode
from flowhook.store.tables import events

__all__ = ["insert_events", "list_events_for_run"]


async def insert_events(conn: AsyncConnection, batch: Sequence[Event]) -> None:
    if not batch:
        return
    await conn.execute(
        events.insert(),
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
