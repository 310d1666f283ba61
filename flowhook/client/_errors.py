"""Exceptions of the SDK.

FlowhookClientError
 ├── APIError            the service answered non-2xx: ``status``, ``code``, ``error``
 ├── WaitTimeout         ``wait`` ran out of attempts before a terminal status
 └── SignatureError      a webhook's signature is missing or wrong (``reason``)
"""

from __future__ import annotations

__all__ = ["FlowhookClientError", "APIError", "WaitTimeout", "SignatureError"]


class FlowhookClientError(Exception):
    pass


class APIError(FlowhookClientError):
    def __init__(self, status: int, code: str, error: str) -> None:
        super().__init__(f"{status} {code}: {error}")
        self.status = status
        self.code = code
        self.error = error


class WaitTimeout(FlowhookClientError):
    def __init__(self, run_id: str, attempts: int, last_status: str) -> None:
        super().__init__(f"run {run_id} was still {last_status} after {attempts} checks")
        self.run_id = run_id
        self.attempts = attempts
        self.last_status = last_status


class SignatureError(FlowhookClientError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
