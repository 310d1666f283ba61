"""The receiving-webhooks page's test vector is the published one, and its FastAPI recipe
verifies it."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docs_vector_matches_the_published_vectors() -> None:
    page = (ROOT / "docs" / "receiving-webhooks.md").read_text()
    case = json.loads((ROOT / "tests" / "data" / "signature-vectors.json").read_text())["cases"][0]
    for value in (
        case["secret"],
        case["x_service_signature"],
        case["webhook_signature"],
        case["body"],
    ):
        assert value in page
    body = re.search(r"\| body \| `(.+?)` \|", page).group(1).encode()  # type: ignore[union-attr]
    assert (
        hmac.new(case["secret"].encode(), body, hashlib.sha256).hexdigest()
        == case["x_service_signature"]
    )
