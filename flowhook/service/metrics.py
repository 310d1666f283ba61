"""Gauges read from the store when /metrics is scraped."""

from __future__ import annotations

from prometheus_client import Gauge

from flowhook.service import Services
from flowhook.store import webhooks as webhooks_store

__all__ = ["refresh_gauges", "OLDEST_PENDING"]

OLDEST_PENDING = Gauge(
    "flowhook_webhook_oldest_pending_seconds",
    "Age of the oldest webhook delivery still pending (0 when none is).",
)


async def refresh_gauges(services: Services) -> None:
    async with services.db.read() as conn:
        oldest = await webhooks_store.oldest_pending(conn)
    age = (services.clock.now() - oldest).total_seconds() if oldest else 0.0
    OLDEST_PENDING.set(max(0.0, age))
