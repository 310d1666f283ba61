from __future__ import annotations

import math

import pytest

from flowhook.backoff import backoff


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "expected"),
    [
        (1, 0.1, 5.0, 0.1),
        (2, 0.1, 5.0, 0.2),
        (3, 0.1, 5.0, 0.4),
        (6, 0.1, 5.0, 3.2),
        (7, 0.1, 5.0, 5.0),  # 6.4 capped
        (50, 0.1, 5.0, 5.0),
        (5000, 0.1, 5.0, 5.0),  # counting without bound never overflows
        (1, 0.0005, 0.05, 0.0005),
        (8, 0.0005, 0.05, 0.05),  # 0.064 capped
        (1, 1.0, math.inf, 1.0),
        (3, 10.0, math.inf, 40.0),
        (1, 0.0, 5.0, 0.0),
    ],
)
def test_backoff_doubles_up_to_the_cap(
    attempt: int, base: float, cap: float, expected: float
) -> None:
    assert backoff(attempt, base, cap) == expected


def test_backoff_matches_the_doubling_it_replaced() -> None:
    delay = 0.5
    for attempt in range(1, 40):
        assert backoff(attempt, 0.5, 10.0) == delay
        delay = min(delay * 2, 10.0)


@pytest.mark.parametrize(
    ("attempt", "jitter", "draw", "expected"),
    [
        (1, 0.5, "low", 0.5 * 0.01),
        (1, 0.5, "high", 1.5 * 0.01),
        (3, 0.5, "low", 0.5 * 0.04),
        (3, 0.5, "high", 1.5 * 0.04),
        (3, 0.0, "high", 0.04),  # no jitter: nothing drawn
    ],
)
def test_jitter_scales_the_wait_within_its_range(
    attempt: int, jitter: float, draw: str, expected: float
) -> None:
    drawn: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return low if draw == "low" else high

    assert backoff(attempt, 0.01, jitter=jitter, uniform=uniform) == pytest.approx(expected)
    assert drawn == ([(1 - jitter, 1 + jitter)] if jitter else [])


def test_jitter_applies_after_the_cap() -> None:
    assert backoff(10, 1.0, 2.0, jitter=0.5, uniform=lambda low, high: high) == 3.0
