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
