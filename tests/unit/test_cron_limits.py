"""Cron checks: an expression that never fires is refused; the shortest gap between ticks."""

from __future__ import annotations

import pytest

from flowhook.cron import check_cron, shortest_gap


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"])
def test_a_cron_that_never_fires_is_refused(expression: str) -> None:
    with pytest.raises(ValueError, match="never fires"):
        check_cron(expression)


def test_a_rare_cron_is_kept() -> None:
    assert check_cron("0 0 29 2 *") == "0 0 29 2 *"


@pytest.mark.parametrize(
    ("expression", "seconds"),
    [
        ("* * * * *", 60),
        ("*/5 * * * *", 300),
        ("0,30 * * * *", 1800),
        ("0 * * * *", 3600),
        ("0 9 * * 1", 86400),
        ("0 0 * * *", 86400),
        ("0,1 0 1 1 *", 60),
        ("59 23,0 * * *", 3600),
        ("* * * * * *", 1),
        ("* * * * * */10", 10),
        ("* * * * * 0,50", 10),
    ],
)
def test_shortest_gap(expression: str, seconds: int) -> None:
    assert shortest_gap(expression) == seconds
