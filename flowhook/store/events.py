"""Events: the outbox. Each is written in the transaction of the change that raised it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.ids import new_id
from flowhook.store import bulk
from flowhook.store.db import EVENTS_FLOOR
from flowhook.store.deliveries import Handoff, Subscriber, insert_deliveries, subscribers
from flowhook.store.driver import Insert
from flowhook.store.models import Delivery, Event, Mode
from flowhook.store.rows import owned, page
from flowhook.store.tables import events, runs

__all__ = [
    "EVENTS_CHANNEL",
    "insert_events",
    "list_events_for_run",
    "list_events",
    "latest_of_type",
    "get_event",
    "events_after",
    "event_ids_after",
    "events_by_id",
    "scope_events_after",
    "run_status",
]

EVENTS_CHANNEL = "flowhook_events"
"""PostgreSQL NOTIFY channel: events were committed; the payload is the lowest event id the
transaction wrote, so a listener reads from there even when ids commit out of order."""


async def insert_events(
    conn: AsyncConnection,
    batch: Sequence[Event],
    *,
    to_endpoint: str | None = None,
    handoff: Handoff | None = None,
) -> int:
    """Write events and, in the same transaction, one delivery per enabled endpoint of the
    event's workspace and mode that chose its type (the outbox's fan-out). A batch may mix
    workspaces and modes (the engine's group commit): one statement writes the events, one
    query per workspace and mode finds the subscribers, one statement queues the deliveries.
    With compound writes the events are written (and announced) by the first of those
    queries' statement. ``handoff``: a dispatcher of this process takes what it can of the
    deliveries (:func:`~flowhook.store.deliveries.insert_deliveries`). Returns the number of
    deliveries queued."""
    if not batch:
        return 0
    rows = [e.to_row() for e in batch]
    floor = min(e.id for e in batch)
    channel = EVENTS_CHANNEL if _announces(conn, floor) else None
    if to_endpoint is not None:  # a test event: to that endpoint alone
        await bulk.insert(conn, events, rows, channel=channel, notice=floor)
        queued = [Delivery.queued(new_id("dlv"), e, to_endpoint) for e in batch]
        await insert_deliveries(conn, queued, handoff=handoff)
        return len(queued)
    # written with the first subscribers' query: one round trip for the three, where it can
    written: Insert | None = Insert(events, rows, channel, floor)
    targets: dict[tuple[str, Mode, str], list[Subscriber]] = {}
    tenants: dict[tuple[str, Mode], set[str]] = {}
    for e in batch:
        tenants.setdefault((e.workspace_id, e.mode), set()).add(e.type)
    for (workspace_id, mode), types in tenants.items():
        found = await subscribers(
            conn, workspace_id, mode, sorted(types), written=written, handoff=handoff
        )
        written = None  # written with the first query
        for sub in found:
            targets.setdefault((workspace_id, mode, sub.event), []).append(sub)
    if not targets:
        return 0
    queued = [
        Delivery.queued(new_id("dlv"), e, sub.endpoint_id)
        for e in batch
        for sub in targets.get((e.workspace_id, e.mode, e.type), ())
        if sub.wants(e.flow_id)  # an endpoint's filter.flow_ids
    ]
    chosen = [s for subs in targets.values() for s in subs]
    fifo = sorted({s.endpoint_id for s in chosen if s.fifo})
    paused = sorted({s.endpoint_id for s in chosen if s.paused})
    await insert_deliveries(conn, queued, fifo=fifo, paused=paused, handoff=handoff)
    return len(queued)


def _announces(conn: AsyncConnection, floor: str) -> bool:
    """Tell event streams at commit: this process's (``conn.info["tx"]``) at once; whether
    other processes must be told too (a NOTIFY where the backend has them, delivered at
    commit, once per transaction and lower floor)."""
    tx = conn.info.get("tx")
    if tx is not None:
        seen = tx.get(EVENTS_FLOOR)
        if seen is not None and seen <= floor:
            return False  # this transaction already announced an event at or below this one
        tx[EVENTS_FLOOR] = floor
    return True


async def events_after(
    conn: AsyncConnection, after: str, *, limit: int, run_ids: Sequence[str] | None = None
) -> list[Event]:
    """Events of every workspace with an id above ``after``, oldest first; with ``run_ids``,
    only those runs' (read through their runs' index: what a busy workspace commits
    meanwhile costs nothing)."""
    q = select(events).where(events.c.id > after).order_by(events.c.id).limit(limit)
    if run_ids is not None:
        q = q.where(events.c.run_id.in_(list(run_ids)))
    return [Event.from_row(r) for r in (await conn.execute(q)).all()]


async def event_ids_after(
    conn: AsyncConnection, after: str, *, limit: int, run_ids: Sequence[str] | None = None
) -> list[str]:
    """Only the ids of :func:`events_after` (an index alone)."""
    q = select(events.c.id).where(events.c.id > after).order_by(events.c.id).limit(limit)
    if run_ids is not None:
        q = q.where(events.c.run_id.in_(list(run_ids)))
    return list((await conn.execute(q)).scalars())


async def events_by_id(conn: AsyncConnection, ids: Sequence[str]) -> list[Event]:
    q = select(events).where(events.c.id.in_(ids)).order_by(events.c.id)
    return [Event.from_row(r) for r in (await conn.execute(q)).all()]


async def scope_events_after(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    after: str,
    *,
    limit: int,
    flow_id: str | None = None,
    event_type: str | None = None,
) -> list[Event]:
    """A workspace and mode's events with an id above ``after``, oldest first (a stream
    resuming from ``Last-Event-ID``)."""
    q = (
        select(events)
        .where(
            events.c.workspace_id == workspace_id,
            events.c.mode == mode.value,
            events.c.id > after,
        )
        .order_by(events.c.id)
        .limit(limit)
    )
    if flow_id is not None:
        q = q.where(events.c.flow_id == flow_id)
    if event_type is not None:
        q = q.where(events.c.type == event_type)
    return [Event.from_row(r) for r in (await conn.execute(q)).all()]


async def run_status(conn: AsyncConnection, run_id: str) -> str | None:
    """The run's status alone (``None`` once it is gone)."""
    status = await conn.scalar(select(runs.c.status).where(runs.c.run_id == run_id))
    return None if status is None else str(status)


async def list_events_for_run(
    conn: AsyncConnection, run_id: str, *, after: str | None = None, limit: int | None = None
) -> list[Event]:
    """The run's events after ``after``, oldest first (at most ``limit``)."""
    q = select(events).where(events.c.run_id == run_id).order_by(events.c.id)
    if after is not None:
        q = q.where(events.c.id > after)
    if limit is not None:
        q = q.limit(limit)
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


async def latest_of_type(
    conn: AsyncConnection, workspace_id: str, mode: Mode, event_type: str, *, scan: int
) -> list[Event]:
    """The events of ``event_type`` among the scope's latest ``scan`` events, newest first:
    a bounded read (an index range of ``scan`` entries), however many events the scope has."""
    latest = (
        select(events.c.id)
        .where(events.c.workspace_id == workspace_id, events.c.mode == mode.value)
        .order_by(events.c.id.desc())
        .limit(scan)
        .scalar_subquery()
    )
    q = (
        select(events)
        .where(events.c.id.in_(latest), events.c.type == event_type)
        .order_by(events.c.id.desc())
    )
    return [Event.from_row(r) for r in (await conn.execute(q)).all()]


async def get_event(
    conn: AsyncConnection, workspace_id: str, mode: Mode, event_id: str
) -> Event | None:
    q = select(events).where(owned(events.c.id, event_id, workspace_id, mode))
    row = (await conn.execute(q)).first()
    return Event.from_row(row) if row else None
