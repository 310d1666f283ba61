"""The queue consumer skeleton the engine's worker and the webhook dispatcher share.

A consumer claims due items from a table in batches and handles each in its own asyncio
task. This module owns what is the same for both: the claim loop (claim again at once after
a full batch; idle, sleep until woken -- work queued here, or NOTIFY from another process --
or until the next item falls due, with a slow poll as the fallback; when the store is
unavailable, back off), start, stop (stop claiming, let what is in flight finish for a grace
period, then cancel it) and drain. A consumer supplies the parts: how many it may claim now,
the claim itself (which starts a task per item in ``_inflight``), when the next item falls
due, the loops it runs beside the claim loop, and what it does once stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, ClassVar

import aiohttp

from flowhook.backoff import backoff
from flowhook.clock import Clock
from flowhook.errors import StoreUnavailable
from flowhook.store.db import Connection, Database
from flowhook.store.wakeup import Wakeup

__all__ = ["Consumer"]

UNAVAILABLE_BACKOFF = 0.1
"""Seconds the claim loop first waits when the store is unavailable; doubled up to the cap."""
UNAVAILABLE_BACKOFF_CAP = 5.0
CLAIM_ERROR_PAUSE = 1.0
"""Seconds the claim loop waits after an unexpected error in a claim."""
DUE_SLACK = 0.005
"""Seconds an idle consumer sleeps past the next item's due time, so the item is due."""


class Consumer:
    """Claim due items, hold at most ``capacity`` of them at once, each in its own task."""

    _name: ClassVar[str]
    """Names the claim loop's task (``flowhook-<name>``) and starts its log lines."""
    _log: ClassVar[logging.Logger]
    _claim_batch: ClassVar[int] = sys.maxsize
    """At most this many items per claim."""

    def __init__(
        self, db: Database, clock: Clock, wakeup: Wakeup, owner: str, *, capacity: int, poll: float
    ) -> None:
        self.db = db
        self.clock = clock
        self.wakeup = wakeup
        self.owner = owner
        self.poll_interval = poll
        """The longest an idle consumer sleeps before it claims again (the fallback poll)."""
        self.http: aiohttp.ClientSession | None = None
        self._capacity = capacity
        """At most this many items held at once (claimed and not yet finished)."""
        self._inflight: dict[str, asyncio.Task[None]] = {}
        """The task handling each item held, by the item's key."""
        self._last_limit = 0
        """How many the last claim could take."""
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        """The claim loop and the side loops."""

    # The parts a consumer supplies.

    async def open(self) -> None:
        """Make what handling items needs (without starting the loops; tests drive
        ``run_once``)."""

    async def _claim(self, limit: int) -> int:
        """Claim up to ``limit`` due items and start a task for each in ``_inflight``; how
        many were claimed."""
        raise NotImplementedError

    async def _next_due(self, conn: Connection) -> datetime | None:
        """When the next item this consumer could claim falls due (``None``: none waits)."""
        raise NotImplementedError

    def _held(self) -> int:
        """How many items this consumer holds now (counted against ``capacity``)."""
        return len(self._inflight)

    def _side_loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        """Loops run beside the claim loop until ``stop``, by task name."""
        return {}

    async def _stopped(self, unfinished: list[str]) -> None:
        """After ``stop`` cancelled the items in flight (``unfinished``: their keys)."""

    # The skeleton.

    async def start(self) -> None:
        await self.open()
        loops = {f"flowhook-{self._name}": self._loop(), **self._side_loops()}
        self._tasks = [asyncio.create_task(loop, name=name) for name, loop in loops.items()]

    async def stop(self, grace: float = 10.0) -> None:
        """Stop claiming; let the items in flight finish for ``grace`` seconds, then cancel
        them."""
        self._stopping.set()
        self.wakeup.notify()
        if self._inflight:
            await asyncio.wait(list(self._inflight.values()), timeout=grace)
        unfinished = list(self._inflight)
        tasks = [*self._inflight.values(), *self._tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._stopped(unfinished)
        if self.http is not None:
            await self.http.close()
            self.http = None

    async def run_once(self) -> int:
        """Claim and start what is due now; how many items were claimed."""
        free = min(self._capacity - self._held(), self._claim_batch)
        self._last_limit = free
        if free <= 0:
            return 0
        return await self._claim(free)

    async def drain(self) -> None:
        """Wait for every item in flight (for tests)."""
        while self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    async def _idle_wait(self) -> None:
        timeout = self.poll_interval
        try:
            async with self.db.read() as conn:
                due = await self._next_due(conn)
            if due is not None:
                wait = max(0.0, (due - self.clock.now()).total_seconds()) + DUE_SLACK
                timeout = min(timeout, wait)
        except StoreUnavailable:
            pass
        await self.wakeup.wait(timeout)

    async def _loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            self.wakeup.clear()
            try:
                claimed = await self.run_once()
                failures = 0
            except StoreUnavailable as exc:
                failures += 1
                delay = backoff(failures, UNAVAILABLE_BACKOFF, UNAVAILABLE_BACKOFF_CAP)
                self._log.warning(
                    "%s: store unavailable (%s); retrying in %.1fs", self._name, _why(exc), delay
                )
                await asyncio.sleep(delay)
                continue
            except Exception:  # noqa: BLE001 - logged with its traceback
                self._log.exception("%s: claim failed", self._name)
                await asyncio.sleep(CLAIM_ERROR_PAUSE)
                continue
            # Full counts what is held, not only what is in flight: a dispatcher's hand-offs
            # (deliveries an open engine transaction took) fill it too, and a loop that took
            # "no room, claimed 0" for "a full batch" spun without ever yielding, so that
            # transaction could never commit and give the room back.
            full = self._held() >= self._capacity
            if claimed >= self._last_limit > 0 and not full:
                continue  # the batch was full: more may be due (a partial one took it all)
            if full:
                await self.wakeup.wait(self.poll_interval)  # a finishing item wakes the loop
            else:
                if claimed:  # the items just claimed go first, the probe of the next due after
                    await asyncio.sleep(0)
                await self._idle_wait()


def _why(exc: BaseException) -> str:
    """What the driver said made the store unavailable, without the statement or its values
    (SQLAlchemy's message carries both)."""
    cause = exc.__cause__
    said = getattr(cause, "orig", None) or cause
    if said is None:
        return str(exc)
    text = str(said).splitlines()[0] if str(said) else ""
    return f"{type(said).__name__}: {text}" if text else type(said).__name__
