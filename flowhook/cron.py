"""Cron ticks in a time zone: five fields (minute hour day month weekday), or six with seconds
last. Daylight saving: a tick that falls in the hour skipped in spring runs at the first
valid time after it (02:30 → 03:00); a tick in the hour repeated in autumn runs once."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

__all__ = ["check_cron", "check_timezone", "next_tick", "shortest_gap"]

_DAY = 86_400


def check_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) not in (5, 6) or not croniter.is_valid(expression):
        raise ValueError(
            f"not a cron expression: {expression!r} (five fields, such as '*/5 * * * *')"
        )
    try:
        croniter(expression, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except CroniterBadDateError:
        raise ValueError(f"the cron expression {expression!r} never fires") from None
    return " ".join(fields)


def shortest_gap(expression: str) -> int:
    """A lower bound, in seconds, on the time between two ticks: from the times of day it
    fires at (any day may fire, and the next day too), so ``0,30 * * * *`` gives 1800 and
    ``0 9 * * 1`` 86400."""
    expanded = croniter(expression).expanded
    minutes, hours = _values(expanded[0], 60), _values(expanded[1], 24)
    seconds = _values(expanded[5], 60) if len(expanded) > 5 else [0]
    times = sorted(h * 3600 + m * 60 + s for h in hours for m in minutes for s in seconds)
    gaps = [b - a for a, b in pairwise(times)]
    return min([*gaps, _DAY - times[-1] + times[0]])


def _values(field: Sequence[int | str], size: int) -> list[int]:
    return list(range(size)) if field == ["*"] else sorted({int(v) for v in field})


def check_timezone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r} (use an IANA name such as Europe/Berlin)"
        ) from None


def next_tick(expression: str, timezone: str, after: datetime) -> datetime:
    """The first tick strictly after ``after``, in UTC."""
    local = after.astimezone(check_timezone(timezone))
    ticks = croniter(expression, local)
    while True:
        tick = ticks.get_next(datetime)
        assert isinstance(tick, datetime)
        # In autumn's repeated hour a wall-clock time comes twice: run it the first time only.
        if tick.replace(tzinfo=None) > local.replace(tzinfo=None):
            return tick.astimezone(UTC)
