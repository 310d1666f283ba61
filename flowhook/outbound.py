"""Why an aiohttp request failed: the classification of ``http`` steps
(:mod:`flowhook.engine.steps.http`). Webhook attempts use their own client
(:mod:`flowhook.webhooks.http`), whose errors :func:`flowhook.webhooks.sender.send` maps to
the same classes (``destination_blocked``, ``dns``, ``tls``, ``connection``,
``invalid_request``).

Timeouts are each caller's own (the sender's per-attempt limit; the step's limit, enforced by
the executor), so they are not classified here: catch ``TimeoutError`` first where it is yours.
"""

from __future__ import annotations

import aiohttp

from flowhook.store.error_classes import ErrorClass
from flowhook.targets import TargetRefused

__all__ = ["classify"]


def classify(
    exc: TargetRefused | aiohttp.ClientError | OSError, *, where: str = ""
) -> tuple[ErrorClass, str]:
    """(error class, detail) of a failed request. ``where`` (the step's ``"<url>: "``)
    prefixes the details of network errors; a refusal or a malformed URL says what it is."""
    if isinstance(exc, TargetRefused):
        return ErrorClass.DESTINATION_BLOCKED, exc.message
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return ErrorClass.DNS, f"{where}{exc}"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return ErrorClass.TLS, f"{where}{exc}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.__cause__, TargetRefused):  # the guarded connector refused the peer
            return ErrorClass.DESTINATION_BLOCKED, exc.__cause__.message
        return ErrorClass.CONNECTION, f"{where}{exc}"
    if isinstance(exc, aiohttp.InvalidURL):
        return ErrorClass.INVALID_REQUEST, f"not a valid URL: {exc}"
    return ErrorClass.CONNECTION, f"{where}{type(exc).__name__}: {exc}"
