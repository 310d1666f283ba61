"""Exponential backoff, as one pure function: the waits a retry loop sleeps between tries."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

__all__ = ["backoff"]


def backoff(
    attempt: int,
    base: float,
    cap: float = math.inf,
    jitter: float = 0.0,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to wait after failed try ``attempt`` (1-based): ``base`` doubled for each try
    after the first, at most ``cap``, then scaled by a random factor in ``1 ± jitter`` (none
    when ``jitter`` is 0; ``uniform`` draws it, for tests). Any ``attempt``, however large,
    gives ``cap``: a loop may count its tries without bound."""
    try:
        delay = min(base * 2.0 ** (attempt - 1), cap)
    except OverflowError:
        delay = cap
    if jitter:
        delay *= uniform(1.0 - jitter, 1.0 + jitter)
    return delay
