"""How a webhook attempt ended when it did not deliver: its ``error_class``, stored in the
attempt log, shown by the API and counted by the metrics, so the values never change."""

from __future__ import annotations

import enum

__all__ = ["ErrorClass", "RETRYABLE", "INTERRUPTED_DETAIL"]


class ErrorClass(enum.StrEnum):
    REDIRECT = "redirect"
    """A 3xx: never followed."""
    THROTTLED = "throttled"
    """A 408 or 429, with ``FLOWHOOK_WEBHOOK_RETRY_THROTTLED`` on."""
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    DESTINATION_BLOCKED = "destination_blocked"
    """The target guard refused the address (loopback, private, …)."""
    TIMEOUT = "timeout"
    DNS = "dns"
    TLS = "tls"
    CONNECTION = "connection"
    INVALID_REQUEST = "invalid_request"
    """A URL or header the client cannot send."""
    ENDPOINT_DELETED = "endpoint_deleted"
    ENDPOINT_DISABLED = "endpoint_disabled"
    INTERRUPTED = "interrupted"
    """The process sending it stopped before it recorded an answer (the webhook may or may
    not have arrived); set when the delivery is claimed again."""


RETRYABLE = frozenset(
    {
        ErrorClass.TIMEOUT,
        ErrorClass.CONNECTION,
        ErrorClass.DNS,
        ErrorClass.TLS,
        ErrorClass.HTTP_5XX,
        ErrorClass.THROTTLED,
    }
)
"""The endings tried again while attempts are left (SPEC §8: a 4xx is final)."""

INTERRUPTED_DETAIL = (
    "the process sending this attempt stopped before it recorded an answer; the webhook may "
    "or may not have arrived"
)
"""The ``error_detail`` of an :attr:`ErrorClass.INTERRUPTED` attempt."""
