"""Exceptions of the SDK.

FlowhookClientError
 ├── APIError            the service answered non-2xx: ``status``, ``code``, ``error``
 ├── WaitTimeout         ``wait`` ran out of attempts before a terminal status
 ├── StreamError         ``stream`` could not go on: dropped too often, or a broken event
 └── SignatureError      a webhook's signature is missing or wrong (``reason``)
"""

from __future__ import annotations

__all__ = ["FlowhookClientError", "APIError", "WaitTimeout", "StreamError", "SignatureError"]


class FlowhookClientError(Exception):
    """Root of every error the SDK raises; catch it to handle them all."""


class APIError(FlowhookClientError):
    """The service answered with a non-2xx status: ``status`` is the HTTP status, ``code``
    the error type of the body (``not_found``, ``invalid_request`` …), ``error`` its message."""

    def __init__(self, status: int, code: str, error: str) -> None:
        super().__init__(f"{status} {code}: {error}")
        self.status = status
        self.code = code
        self.error = error


class WaitTimeout(FlowhookClientError):
    """``wait`` checked ``attempts`` times and the run was still ``last_status``."""

    def __init__(self, run_id: str, attempts: int, last_status: str) -> None:
        super().__init__(f"run {run_id} was still {last_status} after {attempts} checks")
        self.run_id = run_id
        self.attempts = attempts
        self.last_status = last_status


class StreamError(FlowhookClientError):
    """A run's stream gave up before the run's end: ``reason`` says why; ``last_event_id``
    is the last event it delivered (pass it to ``stream(..., last_event_id=)`` to go on)."""

    def __init__(self, run_id: str, last_event_id: str | None, reason: str) -> None:
        after = f" after event {last_event_id}" if last_event_id else ""
        super().__init__(f"stream of run {run_id} stopped{after}: {reason}")
        self.run_id = run_id
        self.last_event_id = last_event_id
        self.reason = reason


class SignatureError(FlowhookClientError):
    """A webhook failed verification; ``reason`` says why (no signature header, a secret that
    is not the whole ``whsec_…`` string, a signature that does not match the body)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
