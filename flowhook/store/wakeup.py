"""Waking idle workers: an in-process signal, and PostgreSQL LISTEN for work queued by other
processes (``insert_run`` issues the NOTIFY inside its transaction, delivered at commit)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg

__all__ = ["Wakeup", "PgListener"]

log = logging.getLogger("flowhook.store")


class Wakeup:
    """Set when work may be waiting; a worker clears it before it claims."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set()


class PgListener:
    """LISTEN on channels and poke each channel's :class:`Wakeup` on every notification."""

    def __init__(self, dsn: str, channels: dict[str, Wakeup]) -> None:
        self._dsn = dsn
        self._channels = channels
        self._conn: Any = None

    async def start(self) -> None:
        try:
            self._conn = await asyncpg.connect(self._dsn)
            for channel in self._channels:
                await self._conn.add_listener(channel, self._on_notify)
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("LISTEN unavailable, falling back to polling: %s", exc)
            self._conn = None

    def _on_notify(self, _conn: Any, _pid: int, channel: str, _payload: str) -> None:
        self._channels[channel].notify()

    async def stop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
            self._conn = None
