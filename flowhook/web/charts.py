"""The overview page's charts, laid out on the server: the page draws them as inline SVG
(templates/_charts.html) with no script.

Horizontal positions are percentages of the chart's width and vertical ones pixels, on an
SVG without a ``viewBox``: the bars stretch to any screen while the text keeps its size, so
a chart reads the same on a phone as on a desktop (a scaled ``viewBox`` would shrink its
labels to a few pixels at 390 px wide). The y-axis labels are a narrow SVG of their own, so
they never sit on a bar.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flowhook.store.models import RunStatus
from flowhook.store.overview import Bucket

__all__ = [
    "STACK_ORDER",
    "chart_counts",
    "StackedChart",
    "stacked",
    "nice_ceiling",
    "number",
    "size",
    "millis",
    "age",
    "share",
]

STACK_ORDER: tuple[str, ...] = ("completed", "failed", "cancelled", "running", "waiting", "queued")
"""Bottom to top; the legend lists them in this order too. ``waiting`` is the part of the
running runs asleep in a step (an approval, a signal, a delay): a run waiting for a person is
not shown as working."""


def chart_counts(bucket: Bucket) -> dict[str, int]:
    """A bucket's runs by what the chart shows: its statuses, with the running ones that
    sleep counted as ``waiting``."""
    counts = {s.value: bucket.counts.get(s, 0) for s in RunStatus}
    waiting = min(bucket.waiting, counts[RunStatus.RUNNING.value])
    counts[RunStatus.RUNNING.value] -= waiting
    counts["waiting"] = waiting
    return counts


HEIGHT = 176
TOP = 12
BASE = 148
"""The bars stand on y = BASE; the tallest reaches y = TOP; the time labels sit below."""


@dataclass(frozen=True, slots=True)
class Segment:
    status: str
    y: float
    height: float
    count: int


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    """Left edge, percent of the chart's width."""
    width: float
    label: str
    """The bucket as people read it (``10:42 UTC``)."""
    summary: str
    """Its counts in words, for the bar's tooltip and screen readers."""
    segments: list[Segment]
    total: int


@dataclass(frozen=True, slots=True)
class StackedChart:
    bars: list[Bar]
    ticks: list[tuple[float, str]]
    """(y, label) of each horizontal grid line."""
    times: list[tuple[float, str, str]]
    """(x percent, text-anchor, label) along the bottom."""
    totals: dict[str, int]
    total: int
    busiest: Bar | None
    rows: list[tuple[str, dict[str, int], int]] = field(default_factory=list)
    """(bucket label, counts, total) of every bucket with runs: the chart as a table."""
    height: int = HEIGHT
    base: int = BASE


def nice_ceiling(value: int) -> int:
    """A round top for a scale of ``value``: 1 up to 1, the next even number up to 10, else
    the smallest of 12, 20, 30, 40, 50, 60, 80, 100, 120, 150, 200, 250, … at least
    ``value``, even, so that the middle grid line is a whole number too."""
    if value <= 1:
        return 1
    if value <= 10:
        return value + value % 2
    tenth: int = 10 ** len(str(value - 1)) // 100  # a tenth of the power of ten below value
    steps = (s * tenth for s in (12, 15, 20, 25, 30, 40, 50, 60, 80, 100))
    return next(top for top in steps if top >= value and top % 2 == 0)


def stacked(
    buckets: Sequence[Bucket], *, width: timedelta, time_format: str, marks: Sequence[str]
) -> StackedChart:
    """A stacked bar per bucket (statuses in :data:`STACK_ORDER`), a y scale up to a round
    number, and ``marks`` (e.g. ``-60 min`` … ``now``) spread evenly along the time axis."""
    top = nice_ceiling(max((b.total for b in buckets), default=0))
    scale = (BASE - TOP) / top
    slot = 100 / max(len(buckets), 1)
    bars: list[Bar] = []
    rows = []
    for i, bucket in enumerate(buckets):
        label = _span(bucket.start, width, time_format)
        y = float(BASE)
        segments = []
        shown = chart_counts(bucket)
        for status in STACK_ORDER:
            n = shown[status]
            if n:
                h = n * scale
                y -= h
                segments.append(Segment(status, round(y, 2), round(h, 2), n))
        bar = Bar(round(i * slot + slot * 0.1, 3), round(slot * 0.8, 3), label,
                  _summary(label, bucket), segments, bucket.total)  # fmt: skip
        bars.append(bar)
        if bucket.total:
            rows.append((label.removesuffix(" UTC"), shown, bucket.total))
    every = [chart_counts(b) for b in buckets]
    totals = {s: sum(c[s] for c in every) for s in STACK_ORDER}
    busiest = max(zip(buckets, bars, strict=True), key=lambda p: p[0].total, default=None)
    ticks = [(round(BASE - f * (BASE - TOP), 2), number(int(top * f))) for f in (0, 0.5, 1)]
    if top == 1:
        ticks = [ticks[0], ticks[2]]
    last = len(marks) - 1
    times = [
        (round(100 * i / last, 3) if last else 0.0, _anchor(i, last), text)
        for i, text in enumerate(marks)
    ]
    return StackedChart(
        bars=bars, ticks=ticks, times=times, totals=totals, total=sum(totals.values()),
        busiest=busiest[1] if busiest and busiest[0].total else None, rows=rows,
    )  # fmt: skip


def _anchor(i: int, last: int) -> str:
    return "start" if i == 0 else "end" if i == last else "middle"


def _span(start: datetime, width: timedelta, time_format: str) -> str:
    end = start + width
    return f"{start.strftime(time_format)}–{end.strftime(time_format)} UTC"


def _summary(label: str, bucket: Bucket) -> str:
    if not bucket.total:
        return f"{label}: no runs"
    shown = chart_counts(bucket)
    parts = [f"{number(shown[s])} {s}" for s in STACK_ORDER if shown[s]]
    runs = "run" if bucket.total == 1 else "runs"
    return f"{label}: {number(bucket.total)} {runs} ({', '.join(parts)})"


def number(n: int | float) -> str:
    """``12,345``."""
    return f"{n:,.0f}"


def size(n: int | float) -> str:
    """Bytes as people read them: ``840 B``, ``12.5 KB``, ``3.2 MB``, ``1.1 GB`` (powers of 1024)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"  # pragma: no cover - the loop returns at GB


def millis(ms: float) -> str:
    """A duration as people read it: ``840 ms``, ``1.2 s``, ``3 min 5 s``, ``2 h 10 min``."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    return age(seconds)


def age(seconds: float) -> str:
    """How long: ``4 s``, ``7 min``, ``7 min 30 s``, ``2 h 5 min``, ``3 d 4 h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s and m < 10 else f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def share(part: int, whole: int) -> float:
    """``part`` in percent of ``whole`` (0 when ``whole`` is 0), for a bar's width."""
    return round(100 * part / whole, 3) if whole else 0.0
