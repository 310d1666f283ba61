"""The throttle and debounce timing rules on a fake clock, and the priority checks."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowhook.clock import FakeClock
from flowhook.definition.control import (
    FlowControl,
    check_priority,
    debounce_due,
    debounce_open,
    throttle_start,
)
from flowhook.errors import InvalidInput


def test_a_throttle_starts_at_once_until_the_limit_then_one_period_after_the_nth_latest() -> None:
    clock = FakeClock()
    reserved: list = []  # latest first, as the store gives them

    def reserve() -> float:
        start = throttle_start(reserved[:3], 3, 10.0, clock.now())
        reserved.insert(0, start)
        return (start - t0).total_seconds()

    t0 = clock.now()
    assert [reserve() for _ in range(3)] == [0, 0, 0]  # the first three go at once
    assert [reserve() for _ in range(4)] == [10, 10, 10, 20]  # then three per period
    clock.advance(25)  # at 25 s the last period holds one start (20 s): at once
    assert reserve() == 25
    assert reserve() == 25  # two in the last period now
    assert reserve() == 30  # a third would make four within 10 s of 20 s: it waits
    clock.advance(100)  # long after: at once again
    assert reserve() == 125


def test_no_window_of_a_period_holds_more_than_the_limit() -> None:
    clock = FakeClock()
    reserved: list = []
    for i in range(200):
        if i % 7 == 0:
            clock.advance(1.3)
        reserved.insert(0, throttle_start(reserved[:5], 5, 4.0, clock.now()))
    starts = sorted(reserved)
    for i in range(5, len(starts)):
        assert starts[i] - starts[i - 5] >= timedelta(seconds=4)


def test_debounce_starts_a_period_after_the_last_execute_capped_by_max_wait() -> None:
    clock = FakeClock()
    first = clock.now()
    assert debounce_due(first, clock.now(), 5, None) == first + timedelta(seconds=5)
    clock.advance(4)
    assert debounce_due(first, clock.now(), 5, None) == first + timedelta(seconds=9)
    assert debounce_due(first, clock.now(), 5, 6) == first + timedelta(seconds=6)
    assert debounce_open(first, clock.now(), 6)
    clock.advance(2)  # six seconds after the first: the run is due, the next starts another
    assert not debounce_open(first, clock.now(), 6)
    assert debounce_open(first, clock.now(), None)


@pytest.mark.parametrize("value", [0, -100, 100, 7.0, "12", "-3"])
def test_priorities_in_range_are_taken(value: object) -> None:
    assert check_priority(value, "priority") == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize("value", [101, -101, 1.5, True, None, "high", [1]])
def test_other_priorities_are_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidInput, match="priority"):
        check_priority(value, "priority")


async def test_keys_are_read_from_the_payload_and_a_flow_without_control_costs_nothing() -> None:
    assert FlowControl.build({"name": "x", "steps": []}) is None
    control = FlowControl.build(
        {"concurrency": {"limit": 2, "key": "{{ payload.customer }}"},
         "throttle": {"limit": 1, "period_seconds": 1},
         "debounce": {"period_seconds": 1, "key": "{{ payload.doc }}"},
         "priority": "{{ payload.rank }}"}
    )  # fmt: skip
    assert control is not None and control.admits
    keys = await control.keys({"customer": 42, "doc": "d1", "rank": 3}, None)
    assert (keys.concurrency_key, keys.throttle_key, keys.debounce_key) == ("42", "", "d1")
    assert keys.priority == 3
    assert (await control.keys({"customer": 42, "doc": "d1", "rank": 3}, -7)).priority == -7
    with pytest.raises(InvalidInput, match=r"concurrency\.key"):
        await control.keys({"doc": "d1", "rank": 3}, None)
    with pytest.raises(InvalidInput, match=r"debounce\.key"):
        await control.keys({"customer": 1, "doc": "x" * 300, "rank": 3}, None)
