"""The overview: how a workspace and mode's runs, flows, webhooks and queues are doing now,
for the settings screen's landing page."""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from flowhook.clock import Clock
from flowhook.service.auth import Principal
from flowhook.service.disk import DiskService, DiskStatus
from flowhook.store import overview as store
from flowhook.store import space
from flowhook.store.db import Database
from flowhook.store.overview import Backlog, Bucket, EndpointRate, FlowDurations

__all__ = ["Overview", "OverviewService", "MINUTE", "HOUR", "DAY", "FLOWS_SHOWN"]

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
FLOWS_SHOWN = 12
"""The busiest flows of the day shown with their durations; the page counts the others."""


@dataclass(frozen=True, slots=True)
class Overview:
    now: datetime
    last_hour: list[Bucket]
    """60 one-minute buckets, the current (partial) minute last."""
    last_day: list[Bucket]
    """24 one-hour buckets, the current (partial) hour last."""
    durations: list[FlowDurations]
    more_flows: int
    """Flows with runs completed in the last day beyond those in :attr:`durations`."""
    endpoints: list[EndpointRate]
    backlog: Backlog
    storage: space.Storage | None = None
    """The database's size and free space (the whole database, every workspace's)."""
    disk: DiskStatus | None = None
    """What the database takes against ``FLOWHOOK_DISK_BUDGET_MB``."""


def bucket_starts(now: datetime, width: timedelta, count: int) -> list[datetime]:
    """The starts of ``count`` buckets of ``width`` (a whole number of seconds that divides
    a day) aligned on UTC, the last one holding ``now``."""
    seconds = int(width.total_seconds())
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    last = day + timedelta(seconds=(now - day) // timedelta(seconds=seconds) * seconds)
    return [last - width * i for i in range(count - 1, -1, -1)]


def _with_waiting(buckets: list[Bucket], asleep: list[datetime], width: timedelta) -> list[Bucket]:
    """``buckets`` with the runs of ``asleep`` (when each was queued, sorted) that each
    holds counted as waiting."""
    return [
        replace(
            b,
            waiting=bisect.bisect_left(asleep, b.start + width)
            - bisect.bisect_left(asleep, b.start),
        )
        for b in buckets
    ]


class OverviewService:
    def __init__(self, db: Database, clock: Clock, disk: DiskService | None = None) -> None:
        self._db = db
        self._clock = clock
        self._disk = disk

    async def get(self, who: Principal) -> Overview:
        """Everything on the page as of now, read on two connections at once: the day's
        runs by hour (the largest read: each run of the day is an index entry it counts) on
        one, the rest (about as long) on the other, so on PostgreSQL the page takes about
        as long as the larger of the two when a core is free. On SQLite statements run on
        the event loop, one after the other: the day is read a quarter at a time and the
        loop gets a turn between statements, so the engine and the API in the same process
        wait for one statement at most (~0.1 s with a million runs a day), not the page."""
        now = self._clock.now()
        ws, mode = who.workspace_id, who.mode

        day_start = bucket_starts(now, HOUR, 24)[0]

        async def by_hour() -> list[Bucket]:
            starts, found = bucket_starts(now, HOUR, 24), []
            async with self._db.read() as conn:
                for i in range(0, len(starts), 6):
                    found += await store.run_buckets(conn, ws, mode, starts[i : i + 6], HOUR)
                    await asyncio.sleep(0)
            return found

        async def the_rest(asleep: list[datetime]) -> Overview:
            async with self._db.read() as conn:
                hour = await store.run_buckets(
                    conn, ws, mode, bucket_starts(now, MINUTE, 60), MINUTE
                )
                await asyncio.sleep(0)
                durations, more = await store.flow_durations(
                    conn, ws, mode, now - DAY, limit=FLOWS_SHOWN
                )
                await asyncio.sleep(0)
                endpoints = await store.endpoint_rates(conn, ws, mode, now - DAY)
                backlog = await store.backlog(conn, ws, mode, now)
                storage = await space.storage(conn)
                asleep += await store.asleep_since(conn, ws, mode, day_start)
            return Overview(now, hour, [], durations, more, endpoints, backlog, storage)

        asleep: list[datetime] = []
        day, rest = await asyncio.gather(by_hour(), the_rest(asleep))
        asleep.sort()
        day = _with_waiting(day, asleep, HOUR)
        rest = replace(rest, last_hour=_with_waiting(rest.last_hour, asleep, MINUTE))
        use = await self._disk.status() if self._disk is not None else None
        return replace(rest, last_day=day, disk=use)
