"""Waking idle workers: an in-process signal, and PostgreSQL LISTEN for work queued by other
processes (the transaction that queues work sends the NOTIFY, :func:`wake_at_commit`,
delivered at commit)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.backoff import backoff
from flowhook.store.driver import driver_of

__all__ = ["Wakeup", "Broadcast", "PgListener", "wake_at_commit"]

log = logging.getLogger("flowhook.store")


class Wakeup:
    """Set when work may be waiting; a worker clears it before it claims.

    ``forward``, when set, is called on every notify as well: ``flowhook serve`` on SQLite
    passes the API process's wake-ups to its engine process that way (:mod:`flowhook.peer`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.forward: Callable[[], None] | None = None

    def notify(self) -> None:
        self._event.set()
        if self.forward is not None:
            self.forward()

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set()


class Broadcast(Wakeup):
    """A :class:`Wakeup` that many waiters share without clearing it for one another: each
    takes :meth:`waiter` before it looks for work, and that waiter is set by the next
    notify, however many others woke (the long polls of ``POST /tasks/claim``)."""

    def __init__(self) -> None:
        super().__init__()
        self._next = asyncio.Event()

    def notify(self) -> None:
        self._next.set()
        self._next = asyncio.Event()
        super().notify()

    def waiter(self) -> asyncio.Event:
        return self._next


class PgListener:
    """LISTEN on channels and poke each channel's :class:`Wakeup` on every notification."""

    def __init__(self, dsn: str, channels: dict[str, Wakeup]) -> None:
        self._dsn = dsn
        self._channels = channels
        self._conn: Any = None
        self._closing = False
        self._reconnect: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._closing = False
        if not await self._connect():
            self._reconnect = asyncio.create_task(self._reconnect_loop())

    async def _connect(self) -> bool:
        try:
            conn = await asyncpg.connect(self._dsn)
            for channel in self._channels:
                await conn.add_listener(channel, self._on_notify)
            conn.add_termination_listener(self._on_lost)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("LISTEN unavailable, polling until it is back: %s", exc)
            return False
        self._conn = conn
        for wakeup in self._channels.values():
            wakeup.notify()  # work may have been queued while we were not listening
        return True

    def _on_lost(self, _conn: Any) -> None:
        self._conn = None
        if not self._closing:
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        tries = 0
        while not self._closing and not await self._connect():
            tries += 1
            await asyncio.sleep(backoff(tries, 0.5, 10.0))

    def _on_notify(self, _conn: Any, _pid: int, channel: str, _payload: str) -> None:
        self._channels[channel].notify()

    async def stop(self) -> None:
        self._closing = True
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reconnect
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
            self._conn = None


async def wake_at_commit(conn: AsyncConnection, kind: str, channel: str) -> None:
    """Wake the consumers of ``kind`` (``runs``, ``deliveries``) once the transaction
    commits: this process's through its :class:`Wakeup` (``Database.transaction``), every
    other process's through ``NOTIFY channel`` where the backend tells them."""
    conn.info.setdefault("wake", set()).add(kind)
    await driver_of(conn).notify(conn, channel)
