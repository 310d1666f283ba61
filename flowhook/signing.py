"""Webhook signatures (SPEC §5, DESIGN.md "Webhook delivery").

- ``X-Service-Signature``: lower-case hex HMAC-SHA256 of the raw body, keyed with the UTF-8
  bytes of the whole secret string as shown to the user (``whsec_…``), as Stripe does.
- Standard Webhooks: ``webhook-signature`` is ``v1,<base64 HMAC-SHA256>`` over
  ``"<webhook-id>.<webhook-timestamp>.<body>"``, keyed with the base64-decoded part after
  ``whsec_``; several signatures are separated by spaces (during a secret rotation).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from datetime import datetime

__all__ = [
    "new_secret",
    "x_service_signature",
    "standard_signature",
    "secret_key_bytes",
    "build_headers",
]

PREFIX = "whsec_"
USER_AGENT = "Flowhook-Webhooks/1"


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def x_service_signature(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def standard_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def build_headers(
    *,
    body: bytes,
    event_id: str,
    event_type: str,
    delivery_id: str,
    attempt: int,
    secret: str,
    previous_secret: str | None,
    now: datetime,
) -> dict[str, str]:
    """Headers for one attempt. During a rotation (``previous_secret`` still valid),
    ``X-Service-Signature`` stays on the previous secret and ``webhook-signature`` carries
    signatures with both."""
    timestamp = int(now.timestamp())
    signatures = [standard_signature(secret, event_id, timestamp, body)]
    if previous_secret:
        signatures.append(standard_signature(previous_secret, event_id, timestamp, body))
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Service-Signature": x_service_signature(previous_secret or secret, body),
        "X-Service-Event": event_type,
        "X-Service-Event-Id": event_id,
        "X-Service-Delivery-Id": delivery_id,
        "X-Service-Attempt": str(attempt),
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signatures),
    }
