"""One delivery attempt: sign, POST, classify the outcome (DESIGN.md "Webhook delivery").

Outcomes: a 2xx within the timeout is delivered. A 3xx is never followed (failed, with the
``Location`` in the error). A 4xx is final. A 5xx, timeout, connection, DNS or TLS error is
retried. A refused target (SSRF guard) is final. 408 and 429 are retried only when
``FLOWHOOK_WEBHOOK_RETRY_THROTTLED`` is on, honouring ``Retry-After``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp

from flowhook.outbound import classify
from flowhook.signing import build_headers
from flowhook.targets import TargetRefused, check_url

__all__ = ["Result", "RETRYABLE", "EXCERPT_BYTES", "build_headers", "send"]

EXCERPT_BYTES = 16 * 1024
RETRYABLE = frozenset({"timeout", "connection", "dns", "tls", "http_5xx", "throttled"})


@dataclass(slots=True)
class Result:
    duration_ms: int
    status_code: int | None = None
    excerpt: str | None = None
    error_class: str | None = None
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
    session: aiohttp.ClientSession,
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
        async with session.post(
            url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            address = None
            if response.connection is not None and response.connection.transport is not None:
                peer = response.connection.transport.get_extra_info("peername")
                address = str(peer[0]) if peer else None
            raw = await response.content.read(EXCERPT_BYTES)
            excerpt = raw.decode("utf-8", "replace")
            status = response.status
            if 200 <= status < 300:
                return done(status_code=status, excerpt=excerpt, address=address)
            if 300 <= status < 400:
                location = response.headers.get("Location", "")
                return done(
                    status_code=status, excerpt=excerpt, address=address, error_class="redirect",
                    error_detail=f"answered {status} redirecting to {location!r}; redirects are not "
                    "followed: register the final URL",
                )  # fmt: skip
            if retry_throttled and status in (408, 429):
                return done(
                    status_code=status, excerpt=excerpt, address=address, error_class="throttled",
                    error_detail=f"answered {status}",
                    retry_after=_retry_after(response.headers.get("Retry-After")),
                )  # fmt: skip
            kind = "http_4xx" if status < 500 else "http_5xx"
            return done(
                status_code=status, excerpt=excerpt, address=address, error_class=kind,
                error_detail=f"answered {status}",
            )  # fmt: skip
    except TimeoutError:  # before OSError, of which it is one
        return done(error_class="timeout", error_detail=f"no answer within {timeout:g} s")
    except (TargetRefused, aiohttp.ClientError, OSError) as exc:
        error_class, detail = classify(exc)
        return done(error_class=error_class, error_detail=detail)
