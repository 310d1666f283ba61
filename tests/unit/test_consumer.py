"""The queue consumer skeleton the worker and the dispatcher share: its claim loop, its idle
wait, backoff while the store is unavailable, and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook import consumer as consumer_module
from flowhook.clock import FakeClock
from flowhook.consumer import Consumer
from flowhook.errors import StoreUnavailable
from flowhook.store.db import Database
from flowhook.store.wakeup import Wakeup


class FakeDb:
    """Only what the skeleton itself uses: a read snapshot for the idle wait."""

    def __init__(self) -> None:
        self.reads = 0

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        self.reads += 1
        yield None


class Queue(Consumer):
    """Items are numbers; handling one waits until the test releases it."""

    _name = "queue"
    _log = logging.getLogger("tests.consumer")
    _claim_batch = 3

    def __init__(self, capacity: int = 4, poll: float = 5.0) -> None:
        self.fake_db = FakeDb()
        self.clock = FakeClock()
        super().__init__(
            cast(Database, self.fake_db),
            self.clock,
            Wakeup(),
            "me",
            capacity=capacity,
            poll=poll,
        )
        self.due: list[int] = []
        self.limits: list[int] = []
        self.failures: list[BaseException] = []
        self.release = asyncio.Event()
        self.next_due: datetime | None = None
        self.side_runs = 0
        self.stopped_with: list[str] | None = None

    async def _claim(self, limit: int) -> int:
        self.limits.append(limit)
        if self.failures:
            raise self.failures.pop(0)
        taken, self.due = self.due[:limit], self.due[limit:]
        for n in taken:
            self._inflight[str(n)] = asyncio.create_task(self._handle(n))
        return len(taken)

    async def _handle(self, n: int) -> None:
        try:
            await self.release.wait()
        finally:
            self._inflight.pop(str(n), None)

    async def _next_due(self, conn: AsyncConnection) -> datetime | None:
        return self.next_due

    def _side_loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"queue-side": self._side()}

    async def _side(self) -> None:
        while True:
            self.side_runs += 1
            await asyncio.sleep(0.001)

    async def _stopped(self, unfinished: list[str]) -> None:
        self.stopped_with = unfinished


async def _until(condition: Any, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


async def test_run_once_claims_what_fits_in_a_batch() -> None:
    queue = Queue(capacity=4)
    queue.due = list(range(10))
    assert await queue.run_once() == 3  # the claim batch
    assert await queue.run_once() == 1  # the room left
    assert await queue.run_once() == 0  # full: no claim at all
    assert queue.limits == [3, 1]
    queue.release.set()
    await queue.drain()
    assert queue._inflight == {}


async def test_the_loop_claims_again_after_a_full_batch_then_waits_idle() -> None:
    queue = Queue(capacity=100)
    queue.due = list(range(7))
    queue.release.set()
    await queue.start()
    await _until(lambda: queue.fake_db.reads >= 1)  # idle: it looked for the next due item
    assert queue.limits == [3, 3, 3]  # two full batches, then a partial one
    queue.due = [7]
    queue.wakeup.notify()
    await _until(lambda: len(queue.limits) == 4)
    await queue.stop(grace=1.0)
    assert queue.side_runs > 0
    assert queue.stopped_with == []


async def test_the_items_just_claimed_start_before_the_idle_wait_looks_for_the_next() -> None:
    """The look for the next due item (a database read) waits for the items the claim
    started to take their first step: a lone run goes first, not behind that read."""
    queue = Queue()
    queue.due = [1]
    order: list[str] = []
    handle = queue._handle

    async def first_step(n: int) -> None:
        order.append(f"item {n}")
        await handle(n)

    async def next_due(conn: AsyncConnection) -> datetime | None:
        order.append("next due")
        return None

    queue._handle = first_step  # type: ignore[method-assign]
    queue._next_due = next_due  # type: ignore[method-assign]
    await queue.start()
    await _until(lambda: len(order) == 2)
    assert order == ["item 1", "next due"]
    await queue.stop(grace=0.0)


async def test_an_idle_consumer_wakes_when_the_next_item_falls_due() -> None:
    queue = Queue(poll=60.0)
    queue.next_due = queue.clock.now() + timedelta(seconds=0.02)
    await queue.start()
    await _until(lambda: len(queue.limits) >= 2, timeout=1.0)  # long before the poll
    await queue.stop(grace=0.0)


async def test_store_unavailable_backs_off_exponentially_and_resets_after_a_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[int] = []

    def backoff(attempt: int, base: float, cap: float) -> float:
        waits.append(attempt)
        assert (base, cap) == (0.1, 5.0)
        return 0.0

    monkeypatch.setattr(consumer_module, "backoff", backoff)
    queue = Queue()
    queue.failures = [StoreUnavailable("down")] * 3
    await queue.start()
    await _until(lambda: len(queue.limits) >= 4)
    queue.failures = [StoreUnavailable("down again")]
    queue.wakeup.notify()
    await _until(lambda: len(waits) == 4)
    await queue.stop(grace=0.0)
    assert waits == [1, 2, 3, 1]


async def test_stop_cancels_what_outlives_the_grace_and_says_which() -> None:
    queue = Queue()
    queue.due = [1, 2]
    await queue.start()
    await _until(lambda: len(queue._inflight) == 2)
    await queue.stop(grace=0.01)
    assert sorted(queue.stopped_with or []) == ["1", "2"]
    assert all(task.done() for task in queue._tasks)


async def test_held_but_not_in_flight_waits_instead_of_spinning() -> None:
    """What a dispatcher holds by hand-off (an engine transaction still open) counts against
    its capacity but is not in flight: the loop used to take "no room, claimed 0" for "a full
    batch, claim again" and spin on the event loop without yielding, so the transaction that
    holds the room never ran to commit. It waits for a wake-up now."""
    queue = Queue(capacity=2, poll=60)
    handed_over = 2
    queue._held = lambda: len(queue._inflight) + handed_over  # type: ignore[method-assign]
    queue.due = [1, 2, 3]
    await queue.start()
    ticks = 0
    for _ in range(50):  # the loop must yield: this test's own task runs meanwhile
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 50 and queue.limits == []  # no claim while the room is taken
    handed_over = 0  # the transaction committed and gave the room back
    queue.wakeup.notify()
    await _until(lambda: queue.limits == [2])
    queue.release.set()
    await queue.stop(grace=1.0)
