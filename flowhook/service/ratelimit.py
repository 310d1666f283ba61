"""Token buckets kept in this process's memory (each process limits on its own)."""

from __future__ import annotations

import time
from collections import OrderedDict

from flowhook.errors import RateLimited

__all__ = ["TokenBuckets"]


class TokenBuckets:
    def __init__(self, *, max_keys: int = 100_000) -> None:
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._max = max_keys

    def take(self, key: str, *, rate: float, burst: float, what: str) -> None:
        """Take one token for ``key`` (refilled at ``rate`` a second up to ``burst``), or raise
        :class:`RateLimited` saying how long to wait."""
        now = time.monotonic()
        tokens, last = self._buckets.get(key, (burst, now))
        tokens = min(burst, tokens + (now - last) * rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            raise RateLimited(
                f"too many requests {what}; slow down", retry_after=(1 - tokens) / rate
            )
        self._buckets[key] = (tokens - 1, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
