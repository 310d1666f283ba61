"""Time, injected: engine, queue and webhooks take a :class:`Clock` and never call ``now()``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = ["Clock", "SystemClock", "FakeClock", "isoformat"]


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    async def sleep_until(self, when: datetime) -> None:
        """Return once this clock reads ``when`` or later."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        wait = (when - self.now()).total_seconds()
        if wait > 0:
            await asyncio.sleep(wait)


class FakeClock:
    """A clock that moves only when told to; for tests. A task asleep on it
    (:meth:`sleep_until`) wakes when :meth:`advance` or :meth:`set` passes its time."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[datetime, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    @property
    def sleepers(self) -> int:
        """How many tasks are asleep on this clock."""
        return sum(1 for _, woken in self._sleepers if not woken.done())

    async def sleep_until(self, when: datetime) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        woken = asyncio.get_running_loop().create_future()
        self._sleepers.append((when, woken))
        try:
            await woken
        finally:
            self._sleepers = [s for s in self._sleepers if s[1] is not woken]

    def advance(self, seconds: float) -> None:
        self.set(self._now + timedelta(seconds=seconds))

    def set(self, when: datetime) -> None:
        self._now = when
        for due, woken in self._sleepers:
            if due <= when and not woken.done():
                woken.set_result(None)


def isoformat(when: datetime) -> str:
    """ISO 8601 UTC with millisecond precision and a ``Z``: ``2026-11-22T10:15:30.123Z``."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
