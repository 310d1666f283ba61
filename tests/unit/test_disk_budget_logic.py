"""The disk budget's decisions (issue 54): how many of the oldest finished runs a round
deletes, the margin it aims for, what the health answer says, and the setting's checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flowhook.config import Settings
from flowhook.service.disk import MARGIN, DiskStatus, megabytes, to_delete

MB = 1024 * 1024


def test_nothing_goes_under_the_margin_or_without_runs() -> None:
    assert to_delete(400 * MB, 500 * MB, 1000) == 0
    assert to_delete(450 * MB, 500 * MB, 1000) == 0  # exactly 90 %: nothing
    assert to_delete(600 * MB, 500 * MB, 0) == 0  # no runs: nothing to delete
    assert to_delete(0, 500 * MB, 10) == 0


def test_a_round_deletes_the_share_over_the_margin_rounded_up() -> None:
    # 612 MB against 500: 162 MB over the 450 MB aimed at, 162/612 of 12,000 runs
    assert to_delete(612 * MB, 500 * MB, 12_000) == 3177
    # between the margin and the budget a round still deletes (a pass past the budget
    # goes on down to the margin)
    assert to_delete(480 * MB, 500 * MB, 1000) == 63
    assert to_delete(450 * MB + 1, 500 * MB, 1000) == 1  # a byte over: one run
    # far over: every run, never more
    assert to_delete(10_000 * MB, 1 * MB, 50) == 50


def test_counting_the_fixed_bytes_as_the_runs_deletes_fewer_than_needed_never_more() -> None:
    # 100 MB of tables and catalogs with no run in them, 500 MB of 1,000 runs (0.5 MB each):
    # 150 MB over the 450 aimed at is 300 runs; the round deletes fewer, the next measures again
    wanted = to_delete(600 * MB, 500 * MB, 1000)
    assert 0 < wanted < 300
    assert wanted == 250


def test_the_margin_is_ninety_percent() -> None:
    assert MARGIN == 0.9
    assert to_delete(100, 100, 10, margin=1.0) == 0
    assert to_delete(101, 100, 10, margin=1.0) == 1


def test_status_as_the_health_answer_says_it() -> None:
    assert DiskStatus(412 * MB, 500 * MB).as_json() == {
        "database_bytes": 412 * MB,
        "budget_bytes": 500 * MB,
        "over_budget": False,
    }
    assert DiskStatus(612 * MB, 500 * MB).over_budget is True
    assert DiskStatus(612 * MB, None).over_budget is False  # no budget: never over it
    assert DiskStatus(None, 500 * MB).over_budget is None  # the store did not answer
    assert DiskStatus(250 * MB, 500 * MB).share == 50.0
    assert DiskStatus(250 * MB, None).share is None


def test_megabytes_in_the_log() -> None:
    assert megabytes(612 * MB) == "612 MB"
    assert megabytes(12_000 * MB) == "12,000 MB"
    assert megabytes(MB // 2) == "0.5 MB"


def test_the_setting_takes_whole_megabytes() -> None:
    assert Settings().disk_budget_mb is None and Settings().disk_budget_bytes is None
    assert Settings(disk_budget_mb="500").disk_budget_bytes == 500 * MB
    assert Settings(disk_budget_mb=" 2 ").disk_budget_mb == 2
    assert Settings(disk_budget_mb="").disk_budget_mb is None  # set empty: as unset


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "500MB", "lots", True])
def test_the_setting_refuses_anything_else_saying_what_it_takes(value: object) -> None:
    with pytest.raises(ValidationError, match="FLOWHOOK_DISK_BUDGET_MB must be a whole number"):
        Settings(disk_budget_mb=value)


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWHOOK_DISK_BUDGET_MB", "750")
    assert Settings().disk_budget_bytes == 750 * MB
    monkeypatch.setenv("FLOWHOOK_DISK_BUDGET_MB", "0")
    with pytest.raises(ValidationError, match="1 or more"):
        Settings()
