"""The overview's chart layouts and the numbers it writes out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flowhook.store.models import RunStatus
from flowhook.store.overview import Bucket
from flowhook.web import charts
from flowhook.web.charts import BASE, TOP

START = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _bucket(i: int, **counts: int) -> Bucket:
    return Bucket(START + i * MINUTE, {RunStatus(k): v for k, v in counts.items()})


@pytest.mark.parametrize(
    ("value", "top"),
    [(0, 1), (1, 1), (3, 4), (7, 8), (10, 10), (11, 12), (13, 20), (21, 30), (99, 100),
     (101, 120), (121, 150), (151, 200), (1001, 1200), (42_000, 50_000)],
)  # fmt: skip
def test_scale_tops_are_round_and_even(value: int, top: int) -> None:
    assert charts.nice_ceiling(value) == top


def test_stacked_bars_are_proportional_and_in_order() -> None:
    chart = charts.stacked(
        [_bucket(0, completed=6, failed=2), _bucket(1), _bucket(2, running=1, queued=1)],
        width=MINUTE,
        time_format="%H:%M",
        marks=("3 min ago", "now"),
    )
    first, empty, last = chart.bars
    assert [s.status for s in first.segments] == ["completed", "failed"]
    full = BASE - TOP  # 8 runs: the scale's top
    assert [s.height for s in first.segments] == [6 / 8 * full, 2 / 8 * full]
    assert first.segments[0].y + first.segments[0].height == BASE  # stands on the base line
    assert first.segments[1].y == TOP  # the tallest bar reaches the top
    assert empty.segments == [] and [s.status for s in last.segments] == ["running", "queued"]
    assert [b.x for b in chart.bars] == [3.333, 36.667, 70.0]  # a tenth of a slot in
    assert [b.width for b in chart.bars] == [26.667] * 3
    assert first.label == "10:00–10:01 UTC"
    assert first.summary == "10:00–10:01 UTC: 8 runs (6 completed, 2 failed)"
    assert empty.summary == "10:01–10:02 UTC: no runs"
    assert chart.total == 10 and chart.totals["failed"] == 2 and chart.totals["cancelled"] == 0
    assert chart.busiest is first
    assert chart.ticks == [(BASE, "0"), ((BASE + TOP) / 2, "4"), (TOP, "8")]
    assert chart.times == [(0.0, "start", "3 min ago"), (100.0, "end", "now")]
    assert [row[0] for row in chart.rows] == ["10:00–10:01", "10:02–10:03"]  # runs only


def test_an_empty_chart_has_no_busiest_bar() -> None:
    chart = charts.stacked([_bucket(0)], width=MINUTE, time_format="%H:%M", marks=("now",))
    assert chart.total == 0 and chart.busiest is None and chart.rows == []


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0 ms"), (840.4, "840 ms"), (1234, "1.2 s"), (12_400, "12 s"), (185_000, "3 min 5 s"),
     (7_800_000, "2 h 10 min")],
)  # fmt: skip
def test_durations_read_as_people_write_them(ms: float, text: str) -> None:
    assert charts.millis(ms) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-3, "0 s"), (4.9, "4 s"), (60, "1 min"), (450, "7 min 30 s"), (900, "15 min"),
     (3600, "1 h"), (7500, "2 h 5 min"), (90_000, "1 d 1 h"), (172_800, "2 d")],
)  # fmt: skip
def test_ages(seconds: float, text: str) -> None:
    assert charts.age(seconds) == text


def test_numbers_and_shares() -> None:
    assert charts.number(1234567) == "1,234,567"
    assert charts.share(1, 3) == 33.333 and charts.share(5, 0) == 0.0
