"""Step retry policy, as a pure function of the step's ``retry`` setting and the attempt."""

from __future__ import annotations

from typing import Any

from flowhook.backoff import backoff as exponential

__all__ = ["max_attempts", "backoff_seconds"]

DEFAULT_BACKOFF = 1.0


def max_attempts(retry: dict[str, Any] | None) -> int:
    return int((retry or {}).get("max_attempts", 1))


def backoff_seconds(retry: dict[str, Any] | None, attempt: int) -> float | None:
    """Seconds to wait after failed ``attempt`` (1-based) before the next, or ``None`` when
    no attempt is left. ``backoff_seconds`` is a number doubled each attempt, or a list whose
    last value repeats."""
    if attempt >= max_attempts(retry):
        return None
    backoff = (retry or {}).get("backoff_seconds", DEFAULT_BACKOFF)
    if isinstance(backoff, list):
        return float(backoff[min(attempt - 1, len(backoff) - 1)])
    return exponential(attempt, float(backoff))
