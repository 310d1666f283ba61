"""The delivery retry policy of SPEC §8, as a pure function (its defaults:
:mod:`flowhook.defaults`; the setting's parser: :func:`flowhook.config.parse_schedule`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from flowhook.defaults import WEBHOOK_MAX_ATTEMPTS, WEBHOOK_RETRY_SCHEDULE

__all__ = ["next_attempt_at"]

JITTER = 0.10


def next_attempt_at(
    attempt: int,
    now: datetime,
    *,
    schedule: Sequence[float] = WEBHOOK_RETRY_SCHEDULE,
    max_attempts: int = WEBHOOK_MAX_ATTEMPTS,
    rand: Callable[[], float] = random.random,
) -> datetime | None:
    """When to try again after failed ``attempt`` (1-based), or ``None`` when it was the last.
    The wait is the schedule's entry for the attempt (the last entry repeats) plus up to 10 %
    jitter, never less."""
    if attempt >= max_attempts:
        return None
    base = schedule[min(attempt - 1, len(schedule) - 1)]
    return now + timedelta(seconds=base * (1 + JITTER * rand()))
