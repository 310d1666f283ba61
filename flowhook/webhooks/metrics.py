"""Prometheus metrics of webhook delivery (served at ``/metrics``)."""

from __future__ import annotations

from functools import cache
from typing import Any

from prometheus_client import Counter, Histogram

from flowhook.store.error_classes import ErrorClass

__all__ = [
    "ATTEMPTS",
    "ATTEMPT_SECONDS",
    "DELIVERY_LATENCY",
    "HANDED_OVER",
    "record_attempt",
    "record_delivered",
]

ATTEMPTS = Counter(
    "flowhook_webhook_attempts_total",
    "Webhook delivery attempts by outcome (delivered or the error class).",
    ["outcome"],
)
ATTEMPT_SECONDS = Histogram(
    "flowhook_webhook_attempt_seconds",
    "Duration of webhook delivery attempts.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
HANDED_OVER = Counter(
    "flowhook_webhook_handed_over_total",
    "Deliveries the engine handed to the dispatcher in the transaction that queued them "
    "(the others are claimed from the queue).",
)


@cache
def _attempts(outcome: str) -> Any:
    """``ATTEMPTS`` of one outcome (looked up once: see ``engine/metrics.py``)."""
    return ATTEMPTS.labels(outcome=outcome)


_E = ErrorClass
OUTCOMES = frozenset(
    {"delivered", _E.REDIRECT, _E.THROTTLED, _E.HTTP_4XX, _E.HTTP_5XX, _E.DESTINATION_BLOCKED,
     _E.TIMEOUT, _E.DNS, _E.TLS, _E.CONNECTION, _E.INVALID_REQUEST}
)  # fmt: skip
"""The label's fixed set; anything else counts as ``other`` (the series stay bounded)."""


def record_attempt(outcome: str, duration_ms: int) -> None:
    _attempts(outcome if outcome in OUTCOMES else "other").inc()
    ATTEMPT_SECONDS.observe(duration_ms / 1000)


DELIVERY_LATENCY = Histogram(
    "flowhook_webhook_delivery_latency_seconds",
    "From a delivery's creation (its event, or a replay) to its acknowledgement.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 120, 600, 3600, 7200),
)


def record_delivered(seconds: float) -> None:
    DELIVERY_LATENCY.observe(max(0.0, seconds))
