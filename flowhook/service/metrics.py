"""Gauges read from the store when /metrics is scraped, and who may scrape it."""

from __future__ import annotations

import hmac

from prometheus_client import Gauge

from flowhook.config import Settings
from flowhook.service import Services
from flowhook.store import control as control_store
from flowhook.store import delivery_reads, space
from flowhook.store import runs as runs_store

__all__ = [
    "refresh_gauges",
    "scrape_allowed",
    "OLDEST_PENDING",
    "QUEUE_DEPTH",
    "OLDEST_QUEUED",
    "RUNS_HELD",
    "DATABASE_SIZE",
    "DATABASE_FREE",
    "STREAMS_OPEN",
    "DATABASE_BYTES",
]

OLDEST_PENDING = Gauge(
    "flowhook_webhook_oldest_pending_seconds",
    "Age of the oldest webhook delivery still pending (0 when none is).",
)


QUEUE_DEPTH = Gauge("flowhook_queue_depth", "Runs queued and not yet started.")
OLDEST_QUEUED = Gauge(
    "flowhook_queue_oldest_seconds", "Age of the oldest queued run (0 when none is)."
)

RUNS_HELD = Gauge(
    "flowhook_runs_held",
    "Queued runs flow control holds back now, by reason (concurrency, throttle, debounce).",
    ["reason"],
)

DATABASE_SIZE = Gauge(
    "flowhook_database_size_bytes",
    "The database's size: SQLite, the main file's pages (page_count × page_size); "
    "PostgreSQL, pg_database_size.",
)
DATABASE_FREE = Gauge(
    "flowhook_database_free_bytes",
    "SQLite: bytes of free pages in the file (freelist_count × page_size), which pruning "
    "gives back to the file system; not reported on PostgreSQL.",
)
DATABASE_BYTES = Gauge(
    "flowhook_database_bytes",
    "What the database takes against FLOWHOOK_DISK_BUDGET_MB: SQLite, the main file and its "
    "WAL (less free pages it cannot give back); PostgreSQL, pg_database_size less the space "
    "vacuum left free in the tables (estimated).",
)
_BUDGET: list[Gauge] = []
"""``flowhook_disk_budget_bytes``, registered the first time a budget is set (none without)."""


def _budget_gauge() -> Gauge:
    if not _BUDGET:
        _BUDGET.append(
            Gauge("flowhook_disk_budget_bytes", "FLOWHOOK_DISK_BUDGET_MB, in bytes (when set).")
        )
    return _BUDGET[0]


STREAMS_OPEN = Gauge(
    "flowhook_event_streams_open",
    "Event streams (Server-Sent Events) this API process has open now.",
)


async def refresh_gauges(services: Services, *, streams_open: int = 0) -> None:
    STREAMS_OPEN.set(streams_open)
    async with services.db.read() as conn:
        oldest = await delivery_reads.oldest_pending(conn)
        depth, oldest_run = await runs_store.queue_depth(conn)
        held = await control_store.held_counts(conn)
        size = await space.storage(conn)
    now = services.clock.now()
    OLDEST_PENDING.set(max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)
    QUEUE_DEPTH.set(depth)
    for reason, count in held.items():
        RUNS_HELD.labels(reason=reason).set(count)
    DATABASE_SIZE.set(size.size_bytes)
    disk = await services.disk.status()
    if disk.database_bytes is not None:
        DATABASE_BYTES.set(disk.database_bytes)
    if disk.budget_bytes is not None:
        _budget_gauge().set(disk.budget_bytes)
    if size.free_bytes is not None:
        DATABASE_FREE.set(size.free_bytes)
    OLDEST_QUEUED.set(max(0.0, (now - oldest_run).total_seconds()) if oldest_run else 0.0)


def scrape_allowed(settings: Settings, authorization: str | None) -> bool:
    """Anyone when FLOWHOOK_METRICS_TOKEN is unset; else only ``Bearer <that token>``,
    compared in constant time."""
    token = settings.metrics_token.get_secret_value() if settings.metrics_token else ""
    if not token:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )
