"""Approval links: their secrets are random, long, and only their hash is kept."""

from __future__ import annotations

import base64
import hashlib

from flowhook.store.approvals import new_token, token_hash


def test_a_link_secret_carries_256_random_bits_and_is_url_safe() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    for token in list(tokens)[:20]:
        assert len(base64.urlsafe_b64decode(token + "=")) == 32
        assert token.replace("-", "").replace("_", "").isalnum()


def test_what_is_stored_is_the_sha256_not_the_secret() -> None:
    token = new_token()
    stored = token_hash(token)
    assert stored == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored and len(stored) == 64
    assert token_hash(token) == stored  # the same link finds the same request
    assert token_hash(new_token()) != stored


def test_a_request_expires_at_its_expiry_and_one_without_never_does() -> None:
    from datetime import UTC, datetime, timedelta

    from flowhook.store.approvals import Approval
    from flowhook.store.models import Mode

    at = datetime(2026, 1, 1, tzinfo=UTC)
    request = Approval("run_x", 0, "ws", Mode.TEST, "manager", "ok?", at, expires_at=at)
    assert not request.expired(at - timedelta(microseconds=1))
    assert request.expired(at) and request.expired(at + timedelta(days=1))
    forever = Approval("run_x", 0, "ws", Mode.TEST, "manager", "ok?", at)
    assert not forever.expired(at + timedelta(days=10_000))
