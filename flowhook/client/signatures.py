"""Verifying Flowhook's webhooks on the receiver's side, over the raw body."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from flowhook.client._errors import SignatureError

__all__ = ["verify_signature", "verify_webhook", "SIGNATURE_HEADER"]

SIGNATURE_HEADER = "X-Service-Signature"


def verify_signature(raw_body: bytes, signature: str, secret: str) -> bool:
    """Whether ``signature`` is the hex HMAC-SHA256 of ``raw_body`` keyed with ``secret``
    (the whole ``whsec_…`` string). Constant time. Pass the bytes you received, not a
    re-serialised JSON document. Raises :class:`SignatureError` when ``signature`` cannot be
    a digest at all (non-ASCII characters)."""
    try:
        given = signature.strip().lower().encode("ascii")
    except UnicodeEncodeError:
        raise SignatureError(
            f"the {SIGNATURE_HEADER} header is not a hex digest (it holds non-ASCII characters)"
        ) from None
    expected = hmac.new(secret.encode(), raw_body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, given)


def verify_webhook(raw_body: bytes, headers: Mapping[str, str], secret: str) -> None:
    """Raise :class:`SignatureError` with a reason unless the request carries a valid
    ``X-Service-Signature`` for ``raw_body``."""
    given = next((v for k, v in headers.items() if k.lower() == SIGNATURE_HEADER.lower()), None)
    if not given:
        raise SignatureError(f"the {SIGNATURE_HEADER} header is missing")
    if not secret.startswith("whsec_"):
        raise SignatureError("the secret should be the endpoint's whole whsec_… string")
    if not verify_signature(raw_body, given, secret):
        raise SignatureError(
            "the signature does not match the body: verify the raw bytes received, before any "
            "JSON parsing, with this endpoint's current secret"
        )
