"""The SDK's receiver-side checks answer every header with True, False or SignatureError."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from flowhook.client import SignatureError, verify_signature, verify_webhook

SECRET = "whsec_" + "A" * 43 + "="
BODY = b'{"event": "flow.completed"}'
GOOD = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()


@pytest.mark.parametrize("header", ["é" * 64, GOOD[:-1] + "é", "☃", "\u0000" + GOOD[1:] + "ü"])
def test_a_non_ascii_signature_raises_signature_error(header: str) -> None:
    with pytest.raises(SignatureError, match="non-ASCII"):
        verify_signature(BODY, header, SECRET)
    with pytest.raises(SignatureError):
        verify_webhook(BODY, {"X-Service-Signature": header}, SECRET)


def test_ascii_signatures_still_compare() -> None:
    assert verify_signature(BODY, GOOD, SECRET)
    assert verify_signature(BODY, f"  {GOOD.upper()} ", SECRET)
    assert not verify_signature(BODY, "0" * 64, SECRET)
    assert not verify_signature(BODY, "short", SECRET)
