"""An id's millisecond, and the lowest id of a millisecond (the event streams' cursors)."""

from __future__ import annotations

import time

from flowhook.ids import id_floor, id_millis, new_id


def test_an_id_knows_its_millisecond_and_sorts_after_its_floor() -> None:
    before = time.time_ns() // 1_000_000
    made = new_id("evt")
    after = time.time_ns() // 1_000_000
    assert before <= id_millis(made) <= after
    assert id_floor("evt", before) <= made < id_floor("evt", after + 1)
    assert id_millis(id_floor("evt", before)) == before
    assert id_floor("evt", -5) == id_floor("evt", 0)
