"""The delivery retry policy of SPEC §8, as a pure function."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

__all__ = ["DEFAULT_SCHEDULE", "next_attempt_at", "parse_schedule"]

DEFAULT_SCHEDULE = (30.0, 120.0, 600.0, 3600.0)
"""Seconds after attempt 1, 2, 3, 4 fails: 30 s, 2 min, 10 min, 1 h."""
JITTER = 0.10


def parse_schedule(text: str) -> tuple[float, ...]:
    """``"30,120,600,3600"`` → seconds; raises ValueError on anything else."""
    values = tuple(float(part) for part in text.split(",") if part.strip())
    if not values or any(v < 0 for v in values):
        raise ValueError("a comma-separated list of non-negative seconds, such as 30,120,600,3600")
    return values


def next_attempt_at(
    attempt: int,
    now: datetime,
    *,
    schedule: Sequence[float] = DEFAULT_SCHEDULE,
    max_attempts: int = 4,
    rand: Callable[[], float] = random.random,
) -> datetime | None:
    """When to try again after failed ``attempt`` (1-based), or ``None`` when it was the last.
    The wait is the schedule's entry for the attempt (the last entry repeats) plus up to 10 %
    jitter, never less."""
    if attempt >= max_attempts:
        return None
    base = schedule[min(attempt - 1, len(schedule) - 1)]
    return now + timedelta(seconds=base * (1 + JITTER * rand()))
