"""One delivery attempt: sign, POST, classify the outcome (DESIGN.md "Webhook delivery").

Outcomes: a 2xx within the timeout is delivered. A 3xx is never followed (failed, with the
``Location`` in the error). A 4xx is final. A 5xx, timeout, connection, DNS or TLS error is
retried. A refused target (SSRF guard) is final. 408 and 429 are retried only when
``FLOWHOOK_WEBHOOK_RETRY_THROTTLED`` is on, honouring ``Retry-After``. The request goes
through :class:`~flowhook.webhooks.http.WebhookClient` (kept-alive connections, the target
guard at connect time); the timeout covers the connection, the request and the answer.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass

from flowhook.signing import build_headers
from flowhook.store.error_classes import RETRYABLE, ErrorClass
from flowhook.targets import TargetRefused, check_url
from flowhook.webhooks.http import (
    EXCERPT_BYTES,
    InvalidRequest,
    ResolveError,
    ResponseError,
    WebhookClient,
)

__all__ = ["Result", "EXCERPT_BYTES", "WebhookClient", "build_headers", "send"]


@dataclass(slots=True)
class Result:
    duration_ms: int
    status_code: int | None = None
    excerpt: str | None = None
    error_class: ErrorClass | None = None
    error_detail: str | None = None
    address: str | None = None
    retry_after: float | None = None

    @property
    def delivered(self) -> bool:
        return self.error_class is None

    @property
    def retryable(self) -> bool:
        return self.error_class in RETRYABLE


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


async def send(
    client: WebhookClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    timeout: float,
    allow_private: bool,
    retry_throttled: bool = False,
) -> Result:
    started = time.perf_counter()

    def done(**kw: object) -> Result:
        return Result(duration_ms=round((time.perf_counter() - started) * 1000), **kw)  # type: ignore[arg-type]

    try:
        check_url(url, allow_private=allow_private)
        async with asyncio.timeout(timeout):
            response = await client.post(url, body, headers)
    except TimeoutError:  # before OSError, of which it is one
        return done(error_class=ErrorClass.TIMEOUT, error_detail=f"no answer within {timeout:g} s")
    except TargetRefused as exc:
        return done(error_class=ErrorClass.DESTINATION_BLOCKED, error_detail=exc.message)
    except InvalidRequest as exc:
        return done(error_class=ErrorClass.INVALID_REQUEST, error_detail=str(exc))
    except ResolveError as exc:
        return done(error_class=ErrorClass.DNS, error_detail=str(exc))
    except ssl.SSLError as exc:  # certificate errors are SSLErrors too
        return done(error_class=ErrorClass.TLS, error_detail=f"{type(exc).__name__}: {exc}")
    except ResponseError as exc:
        return done(error_class=ErrorClass.CONNECTION, error_detail=str(exc))
    except OSError as exc:
        return done(error_class=ErrorClass.CONNECTION, error_detail=f"{type(exc).__name__}: {exc}")
    status = response.status
    excerpt = response.body.decode("utf-8", "replace")
    address = response.address
    if 200 <= status < 300:
        return done(status_code=status, excerpt=excerpt, address=address)
    if 300 <= status < 400:
        location = response.headers.get("location", "")
        return done(
            status_code=status, excerpt=excerpt, address=address, error_class=ErrorClass.REDIRECT,
            error_detail=f"answered {status} redirecting to {location!r}; redirects are not "
            "followed: register the final URL",
        )  # fmt: skip
    if retry_throttled and status in (408, 429):
        return done(
            status_code=status, excerpt=excerpt, address=address, error_class=ErrorClass.THROTTLED,
            error_detail=f"answered {status}",
            retry_after=_retry_after(response.headers.get("retry-after")),
        )  # fmt: skip
    kind = ErrorClass.HTTP_4XX if status < 500 else ErrorClass.HTTP_5XX
    return done(
        status_code=status, excerpt=excerpt, address=address, error_class=kind,
        error_detail=f"answered {status}",
    )  # fmt: skip
