"""Signatures against the outside truth in tests/data/signature-vectors.json (computed with
the standard library and the standardwebhooks package, not by this project)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from flowhook.config import parse_schedule
from flowhook.signing import new_secret, standard_signature, x_service_signature
from flowhook.webhooks.retry import next_attempt_at

VECTORS = json.loads((Path(__file__).parents[1] / "data" / "signature-vectors.json").read_text())[
    "cases"
]


@pytest.mark.parametrize("case", VECTORS)
def test_signature_vectors(case: dict[str, Any]) -> None:
    body = case["body"].encode()
    assert x_service_signature(case["secret"], body) == case["x_service_signature"]
    assert (
        standard_signature(case["secret"], case["webhook_id"], int(case["webhook_timestamp"]), body)
        == case["webhook_signature"]
    )


def test_new_secrets_verify_with_stdlib_and_standardwebhooks() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    body = b'{"event":"flow.completed"}'
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(x_service_signature(secret, body), expected)
    now = int(datetime.now(UTC).timestamp())
    headers = {
        "webhook-id": "evt_1",
        "webhook-timestamp": str(now),
        "webhook-signature": standard_signature(secret, "evt_1", now, body),
    }
    assert Webhook(secret).verify(body, headers) == {"event": "flow.completed"}


T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("attempt", "seconds"),
    [(1, 30), (2, 120), (3, 600), (4, None)],
)
def test_spec_schedule_without_jitter(attempt: int, seconds: float | None) -> None:
    got = next_attempt_at(attempt, T0, rand=lambda: 0.0)
    assert got == (None if seconds is None else T0 + timedelta(seconds=seconds))


def test_jitter_adds_at_most_ten_percent_and_never_subtracts() -> None:
    assert next_attempt_at(1, T0, rand=lambda: 0.999) < T0 + timedelta(seconds=33.01)  # type: ignore[operator]
    assert next_attempt_at(1, T0, rand=lambda: 0.0) == T0 + timedelta(seconds=30)


def test_raised_maximum_reaches_the_hour_step_and_repeats_the_last() -> None:
    assert next_attempt_at(4, T0, max_attempts=6, rand=lambda: 0.0) == T0 + timedelta(hours=1)
    assert next_attempt_at(5, T0, max_attempts=6, rand=lambda: 0.0) == T0 + timedelta(hours=1)
    assert next_attempt_at(6, T0, max_attempts=6) is None


def test_parse_schedule() -> None:
    assert parse_schedule("1, 2.5,3") == (1.0, 2.5, 3.0)
    with pytest.raises(ValueError, match="comma-separated"):
        parse_schedule("")
    with pytest.raises(ValueError, match="comma-separated"):
        parse_schedule("-1")
