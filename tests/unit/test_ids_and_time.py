from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta, timezone

from flowhook.clock import FakeClock, SystemClock, isoformat
from flowhook.ids import _base32, _base32_128, is_id, new_id


def test_ids_have_their_prefix_and_sort_by_creation() -> None:
    ids = [new_id("run") for _ in range(5000)]
    assert all(is_id(i, "run") for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(len(i) == len("run_") + 26 for i in ids)


def test_the_fast_encoding_is_the_reference_one() -> None:
    # new_id's 10-bits-at-a-time encoding against the digit-by-digit loop, edges included
    edges = [0, 1, 31, 32, 1023, 1024, (1 << 128) - 1, 1 << 127, (1 << 80) - 1, 1 << 80]
    draws = [random.getrandbits(128) for _ in range(20_000)]
    for value in edges + draws:
        assert _base32_128(value) == _base32(value)


def test_is_id_rejects_other_shapes() -> None:
    assert not is_id("run_x", "run")
    assert not is_id(new_id("wf"), "run")
    assert not is_id("run_" + "u" * 26, "run")  # u is not in the alphabet
    assert not is_id("run_9" + "0" * 25, "run")  # first character above 7 overflows 128 bits


def test_isoformat_is_utc_with_milliseconds_and_z() -> None:
    when = datetime(2026, 11, 22, 10, 15, 30, 123456, tzinfo=UTC)
    assert isoformat(when) == "2026-11-22T10:15:30.123Z"
    other = when.astimezone(timezone(timedelta(hours=5)))
    assert isoformat(other) == "2026-11-22T10:15:30.123Z"


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock()
    start = clock.now()
    assert clock.now() == start
    clock.advance(30)
    assert clock.now() - start == timedelta(seconds=30)


async def test_a_fake_clock_wakes_its_sleepers_when_moved_past_their_time() -> None:
    clock = FakeClock()
    t0 = clock.now()
    woke: list[float] = []

    async def sleeper(seconds: float) -> None:
        await clock.sleep_until(t0 + timedelta(seconds=seconds))
        woke.append((clock.now() - t0).total_seconds())

    tasks = [asyncio.create_task(sleeper(s)) for s in (0, 1, 2)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert (woke, clock.sleepers) == ([0.0], 2)  # a time already come does not sleep
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert (woke, clock.sleepers) == ([0.0], 2)
    clock.advance(1.0)  # past the first: it wakes, the other sleeps on
    await asyncio.wait_for(tasks[1], 1)
    assert (woke, clock.sleepers) == ([0.0, 1.5], 1)
    tasks[2].cancel()  # a cancelled sleeper is forgotten
    await asyncio.gather(tasks[2], return_exceptions=True)
    assert clock.sleepers == 0 and clock._sleepers == []


async def test_the_system_clock_sleeps_until_its_time() -> None:
    clock = SystemClock()
    until = clock.now() + timedelta(milliseconds=20)
    await clock.sleep_until(until)
    assert clock.now() >= until
    await clock.sleep_until(until - timedelta(seconds=1))  # a past time returns at once
