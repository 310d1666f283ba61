from __future__ import annotations

from typing import Any

import pytest

from flowhook.engine.retry import backoff_seconds, max_attempts


@pytest.mark.parametrize(
    ("retry", "attempt", "expected"),
    [
        (None, 1, None),
        ({"max_attempts": 1}, 1, None),
        ({"max_attempts": 3}, 1, 1.0),
        ({"max_attempts": 3}, 2, 2.0),
        ({"max_attempts": 3}, 3, None),
        ({"max_attempts": 5, "backoff_seconds": 10}, 1, 10.0),
        ({"max_attempts": 5, "backoff_seconds": 10}, 3, 40.0),
        ({"max_attempts": 5, "backoff_seconds": [5, 30]}, 1, 5.0),
        ({"max_attempts": 5, "backoff_seconds": [5, 30]}, 2, 30.0),
        ({"max_attempts": 5, "backoff_seconds": [5, 30]}, 4, 30.0),
        ({"max_attempts": 5, "backoff_seconds": [5, 30]}, 5, None),
    ],
)
def test_backoff_table(retry: dict[str, Any] | None, attempt: int, expected: float | None) -> None:
    assert backoff_seconds(retry, attempt) == expected


def test_max_attempts_defaults_to_one() -> None:
    assert max_attempts(None) == 1
    assert max_attempts({"max_attempts": 4}) == 4
