"""An endpoint's request slots: more while it answers 2xx fast, back to the floor when it is
slow or failing, never more holders than the limit, waiters served in order."""

from __future__ import annotations

import asyncio

import pytest

from flowhook.webhooks.slots import FAST, EndpointSlots


def test_fast_answers_add_a_slot_each_up_to_the_ceiling() -> None:
    slots = EndpointSlots(2, 5)
    for expected in (3, 4, 5, 5):
        slots.answered(True, 0.01)
        assert slots.limit == expected


@pytest.mark.parametrize(("ok", "seconds"), [(False, 0.01), (True, FAST), (False, 30.0)])
def test_a_failure_or_a_slow_answer_halves_the_slots_down_to_the_floor(
    ok: bool, seconds: float
) -> None:
    slots = EndpointSlots(3, 32)
    for _ in range(29):
        slots.answered(True, 0.01)
    assert slots.limit == 32
    for expected in (16, 8, 4, 3, 3):
        slots.answered(ok, seconds)
        assert slots.limit == expected


def test_a_ceiling_below_the_floor_is_the_floor() -> None:
    slots = EndpointSlots(8, 4)
    slots.answered(True, 0.01)
    assert (slots.limit, slots.ceiling) == (8, 8)


async def test_never_more_holders_than_the_limit_and_waiters_go_in_order() -> None:
    slots = EndpointSlots(2, 4)
    order: list[int] = []
    peak = 0
    release = asyncio.Event()

    async def hold(i: int) -> None:
        nonlocal peak
        async with slots:
            order.append(i)
            peak = max(peak, slots.busy)
            await release.wait()

    tasks = [asyncio.create_task(hold(i)) for i in range(6)]
    await asyncio.sleep(0)
    assert order == [0, 1] and slots.busy == 2
    slots.answered(True, 0.01)  # one more slot: the first waiter gets it at once
    await asyncio.sleep(0)
    assert order == [0, 1, 2] and slots.busy == 3
    release.set()
    await asyncio.gather(*tasks)
    assert order == list(range(6))
    assert peak == 3 and slots.busy == 0


async def test_a_cancelled_waiter_leaves_no_slot_taken() -> None:
    slots = EndpointSlots(1, 1)
    gate = asyncio.Event()

    async def hold() -> None:
        async with slots:
            await gate.wait()

    await slots.__aenter__()  # the one slot, held here
    waiting = asyncio.create_task(hold())
    woken = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiting.cancel()  # cancelled while it waits
    await asyncio.sleep(0)
    await slots.__aexit__(None, None, None)  # the slot goes to ``woken``...
    woken.cancel()  # ...which is cancelled before it runs: it gives the slot back
    for task in (waiting, woken):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert slots.busy == 0
    async with slots:  # and it is free
        assert slots.busy == 1
