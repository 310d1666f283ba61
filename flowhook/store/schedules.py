"""Cron schedules. ``next_run_at`` is the next tick; moving it is the guarded claim of a tick."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.models import Mode
from flowhook.store.rows import from_row, owned, page
from flowhook.store.tables import schedules, workspaces

__all__ = [
    "Schedule",
    "insert_schedule",
    "get_schedule",
    "list_schedules",
    "count_schedules",
    "save_schedule",
    "delete_schedule",
    "due_schedules",
    "advance",
]


@dataclass(slots=True)
class Schedule:
    id: str
    workspace_id: str
    mode: Mode
    flow_id: str
    cron: str
    timezone: str
    payload: dict[str, Any]
    enabled: bool
    next_run_at: datetime
    created_at: datetime
    updated_at: datetime


def _schedule(row: Any) -> Schedule:
    return from_row(Schedule, row, {"mode": Mode, "enabled": bool})


def _values(s: Schedule) -> dict[str, Any]:
    return {
        "cron": s.cron, "timezone": s.timezone, "payload": s.payload, "enabled": s.enabled,
        "next_run_at": s.next_run_at, "updated_at": s.updated_at,
    }  # fmt: skip


async def insert_schedule(conn: AsyncConnection, s: Schedule) -> None:
    await conn.execute(
        schedules.insert().values(
            id=s.id, workspace_id=s.workspace_id, mode=str(s.mode), flow_id=s.flow_id,
            created_at=s.created_at, **_values(s),
        )
    )  # fmt: skip


async def get_schedule(
    conn: AsyncConnection, workspace_id: str, mode: Mode, schedule_id: str
) -> Schedule | None:
    q = select(schedules).where(owned(schedules.c.id, schedule_id, workspace_id, mode))
    row = (await conn.execute(q)).first()
    return _schedule(row) if row else None


async def list_schedules(
    conn: AsyncConnection, workspace_id: str, mode: Mode, *, limit: int, after: str | None
) -> list[Schedule]:
    q = page(schedules, schedules.c.id, workspace_id, mode, limit=limit, after=after)
    return [_schedule(r) for r in (await conn.execute(q)).all()]


async def count_schedules(conn: AsyncConnection, workspace_id: str, mode: Mode) -> int:
    """The workspace's schedules in ``mode``, with the workspace row locked until the
    transaction ends (PostgreSQL; SQLite has one writer), so that concurrent creates count
    one after another and a cap checked on this count holds."""
    await conn.execute(
        select(workspaces.c.id).where(workspaces.c.id == workspace_id).with_for_update()
    )
    q = select(func.count()).where(
        schedules.c.workspace_id == workspace_id, schedules.c.mode == str(mode)
    )
    return int((await conn.execute(q)).scalar_one())


async def save_schedule(conn: AsyncConnection, s: Schedule) -> None:
    await conn.execute(update(schedules).where(schedules.c.id == s.id).values(**_values(s)))


async def delete_schedule(
    conn: AsyncConnection, workspace_id: str, mode: Mode, schedule_id: str
) -> bool:
    result = await conn.execute(
        delete(schedules).where(owned(schedules.c.id, schedule_id, workspace_id, mode))
    )
    return bool(result.rowcount == 1)


async def due_schedules(conn: AsyncConnection, now: datetime, limit: int = 100) -> list[Schedule]:
    q = (
        select(schedules)
        .where(schedules.c.enabled.is_(True), schedules.c.next_run_at <= now)
        .order_by(schedules.c.next_run_at)
        .limit(limit)
    )
    return [_schedule(r) for r in (await conn.execute(q)).all()]


async def advance(conn: AsyncConnection, schedule_id: str, *, tick: datetime, to: datetime) -> bool:
    """Claim ``tick``: move ``next_run_at`` from it to ``to``. Only one process wins a tick."""
    result = await conn.execute(
        update(schedules)
        .where(
            schedules.c.id == schedule_id,
            schedules.c.next_run_at == tick,
            schedules.c.enabled.is_(True),
        )
        .values(next_run_at=to)
    )
    return bool(result.rowcount == 1)


async def next_due(conn: AsyncConnection) -> datetime | None:
    value = (
        await conn.execute(
            select(func.min(schedules.c.next_run_at)).where(schedules.c.enabled.is_(True))
        )
    ).scalar_one_or_none()
    if value is None:
        return None
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
