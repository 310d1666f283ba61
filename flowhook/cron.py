"""Cron ticks in a time zone: five fields (minute hour day month weekday), or six with seconds
last. Daylight saving: a tick that falls in the hour skipped in spring runs at the first
valid time after it (02:30 → 03:00); a tick in the hour repeated in autumn runs once."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

__all__ = ["check_cron", "check_timezone", "next_tick"]


def check_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) not in (5, 6) or not croniter.is_valid(expression):
        raise ValueError(
            f"not a cron expression: {expression!r} (five fields, such as '*/5 * * * *')"
        )
    return " ".join(fields)


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
