"""Defaults more than one layer needs: the webhook retry policy of SPEC §8. The settings
(:mod:`flowhook.config`) and the dispatcher's own defaults (:mod:`flowhook.webhooks`, for
tests and embedding) both read them here, so the two cannot drift apart."""

from __future__ import annotations

__all__ = [
    "WEBHOOK_RETRY_SCHEDULE",
    "WEBHOOK_MAX_ATTEMPTS",
    "WEBHOOK_TIMEOUT",
    "WEBHOOK_DISABLE_AFTER_DAYS",
]

WEBHOOK_RETRY_SCHEDULE = (30.0, 120.0, 600.0, 3600.0)
"""Seconds after attempt 1, 2, 3, 4 fails: 30 s, 2 min, 10 min, 1 h (the last repeats)."""
WEBHOOK_MAX_ATTEMPTS = 4
"""Attempts of a delivery in all before it fails."""
WEBHOOK_TIMEOUT = 10.0
"""Seconds an attempt waits for its answer."""
WEBHOOK_DISABLE_AFTER_DAYS = 5
"""An endpoint with nothing but failures for this many days is disabled."""
