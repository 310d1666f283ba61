"""A run's ``waiting_for`` as the few words a list's status cell holds: "waiting for
approval", "waiting for signal order.paid", "sleeping until 10:15 UTC". The run's page says
the whole sentence (templates/_why.html); the CLI has its own line (flowhook.cli_watch)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["waiting_words", "clock_time"]


def clock_time(value: datetime | str | None, now: datetime | None = None) -> str:
    """``10:15 UTC`` today, ``Dec 6 10:15 UTC`` another day; ``""`` for nothing."""
    if value is None or value == "":
        return ""
    at = value if isinstance(value, datetime) else _parse(value)
    if at is None:
        return str(value)
    at = at.astimezone(UTC)
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    shown = at.strftime("%H:%M UTC")
    return shown if at.date() == today else f"{at.strftime('%b')} {at.day} {shown}"


def _parse(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def waiting_words(why: dict[str, Any] | None, now: datetime | None = None) -> str:
    """What an active run waits for, in a few words; ``""`` when it does not wait."""
    if not why:
        return ""
    until = clock_time(why.get("until"), now)
    match why.get("reason"):
        case "worker":
            return "queued"
        case "paused":
            return "held: flow paused"
        case "concurrency":
            return "held: concurrency limit"
        case "throttle":
            return f"throttled until {until}" if until else "throttled"
        case "debounce":
            return "debounced"
        case "delay":
            return f"sleeping until {until}" if until else "sleeping"
        case "retry":
            return f"retrying at {until}" if until else "retrying"
        case "signal":
            return f"waiting for signal {why.get('name') or ''}".rstrip()
        case "approval":
            return "waiting for approval"
        case "child":
            return "waiting for a child run"
        case "parts":
            return "waiting for its parts"
        case "task":
            return f"waiting for task {why.get('task') or ''}".rstrip()
    return f"waiting ({why.get('reason')})"
