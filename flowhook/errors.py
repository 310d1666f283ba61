"""Domain errors, with no HTTP in them; ``api/errors.py`` maps each class to a status.

FlowhookError
 ├── InvalidInput            bad input from outside (names the field)
 │    └── InvalidDefinition  a flow definition that fails its schema
 ├── Unauthenticated         missing, unknown or revoked API key
 ├── Forbidden               a known caller that may not do this (a form without its token)
 ├── NotFound                unknown, or not in the caller's workspace and mode
 ├── Conflict                state does not allow the request
 │    └── IdempotencyConflict
 ├── RateLimited             too many requests (``retry_after`` seconds)
 ├── PayloadTooLarge
 ├── UnsupportedMediaType
 ├── StoreUnavailable        the database cannot be reached
 │    └── WriteConflict      a transaction lost a deadlock or serialization conflict
 ├── Duplicate               a unique key refused a row (most often one written meanwhile)
 └── SecretKeyError          FLOWHOOK_SECRET_KEY (or the key file) missing, malformed or wrong
"""

from __future__ import annotations

__all__ = [
    "FlowhookError",
    "InvalidInput",
    "InvalidDefinition",
    "InvalidPayload",
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
    "Duplicate",
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
    """Bad input from outside; ``field`` names the part at fault where there is one."""

    code = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.field = field


class InvalidPayload(InvalidInput):
    """A run's payload that fails its flow's ``input_schema``: ``problems`` holds (field,
    what is wrong) for each way it fails, the error's ``field`` is the first's."""

    def __init__(self, message: str, problems: list[tuple[str, str]]) -> None:
        super().__init__(message, field=problems[0][0] if problems else None)
        self.problems = problems


class InvalidDefinition(InvalidInput):
    """A flow definition that fails its JSON Schema or its semantic checks: ``problems``
    holds each problem found (one per place), this error's message is the first's."""

    code = "invalid_definition"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message, field=field, code=code)
        self.problems: list[InvalidDefinition] = [self]

    @classmethod
    def of(cls, problems: list[InvalidDefinition]) -> InvalidDefinition:
        """One error for every problem of a definition (the first's message, and how many
        more there are)."""
        first = problems[0]
        more = len(problems) - 1
        said = (
            f"{first.message} (and {more} more problem{'s' if more > 1 else ''})"
            if more
            else first.message
        )
        every = cls(said, field=first.field)
        every.problems = list(problems)
        return every


class Unauthenticated(FlowhookError):
    """A missing, unknown or revoked API key (or signed-out session)."""

    code = "unauthenticated"


class Forbidden(FlowhookError):
    """The caller is known but may not do this (a settings-screen form posted without its
    CSRF token)."""

    code = "forbidden"


class NotFound(FlowhookError):
    """Unknown, or not in the caller's workspace and mode: the two are never told apart."""

    code = "not_found"


class Conflict(FlowhookError):
    """The resource's state does not allow the request (a run already ended, a flow changed
    meanwhile)."""

    code = "conflict"


class IdempotencyConflict(Conflict):
    """An ``Idempotency-Key`` used before with another request body."""

    code = "idempotency_conflict"


class RateLimited(FlowhookError):
    """Too many requests; ``retry_after`` says how many seconds to wait."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PayloadTooLarge(FlowhookError):
    """A request body over its limit."""

    code = "payload_too_large"


class UnsupportedMediaType(FlowhookError):
    """A body that is not JSON where JSON is required."""

    code = "unsupported_media_type"


class StoreUnavailable(FlowhookError):
    """The database cannot be reached or answered with an error; nothing was written."""

    code = "store_unavailable"


class WriteConflict(StoreUnavailable):
    """PostgreSQL ended the transaction to break a deadlock (SQLSTATE 40P01) or a
    serialization failure (40001). Such a transaction wrote nothing, so running it again is
    safe (``Database.retrying`` does); one that still fails answers 503 like an outage."""


class Duplicate(FlowhookError):
    """A write met a row with the same unique key, most often one another request committed
    meanwhile (the same Idempotency-Key, signal or inbound delivery id): the store raises it
    for the driver's unique-violation error, and the caller runs its work again, which then
    finds that row. One that escapes answers 500, as the driver's error did."""

    code = "duplicate"


class SecretKeyError(FlowhookError):
    """The key that encrypts stored secrets is missing, malformed or cannot open them."""

    code = "secret_key"
