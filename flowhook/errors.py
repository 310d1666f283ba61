"""Domain errors, with no HTTP in them; ``api/errors.py`` maps each class to a status.

FlowhookError
 ├── InvalidInput            bad input from outside (names the field)
 │    └── InvalidDefinition  a flow definition that fails its schema
 ├── Unauthenticated         missing, unknown or revoked API key
 ├── NotFound                unknown, or not in the caller's workspace and mode
 ├── Conflict                state does not allow the request
 │    └── IdempotencyConflict
 ├── PayloadTooLarge
 ├── UnsupportedMediaType
 ├── StoreUnavailable        the database cannot be reached
 │    └── WriteConflict      a transaction lost a deadlock or serialization conflict
 └── SecretKeyError          FLOWHOOK_SECRET_KEY (or the key file) missing, malformed or wrong
"""

from __future__ import annotations

__all__ = [
    "FlowhookError",
    "InvalidInput",
    "InvalidDefinition",
    "Unauthenticated",
    "Forbidden",
    "NotFound",
    "Conflict",
    "IdempotencyConflict",
    "PayloadTooLarge",
    "RateLimited",
    "UnsupportedMediaType",
    "StoreUnavailable",
    "WriteConflict",
    "SecretKeyError",
]


class FlowhookError(Exception):
    """Root of every error this package raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidInput(FlowhookError):
    code = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.field = field


class InvalidDefinition(InvalidInput):
    code = "invalid_definition"


class Unauthenticated(FlowhookError):
    code = "unauthenticated"


class Forbidden(FlowhookError):
    code = "forbidden"


class NotFound(FlowhookError):
    code = "not_found"


class Conflict(FlowhookError):
    code = "conflict"


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"


class RateLimited(FlowhookError):
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PayloadTooLarge(FlowhookError):
    code = "payload_too_large"


class UnsupportedMediaType(FlowhookError):
    code = "unsupported_media_type"


class StoreUnavailable(FlowhookError):
    code = "store_unavailable"


class WriteConflict(StoreUnavailable):
    """PostgreSQL ended the transaction to break a deadlock (SQLSTATE 40P01) or a
    serialization failure (40001). Such a transaction wrote nothing, so running it again is
    safe (``Database.retrying`` does); one that still fails answers 503 like an outage."""


class SecretKeyError(FlowhookError):
    """The key that encrypts stored secrets is missing, malformed or cannot open them."""

    code = "secret_key"
