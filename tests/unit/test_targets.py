"""The target guard against the outside truth in tests/data/ssrf-cases.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowhook.targets import TargetRefused, check_url

CASES = json.loads((Path(__file__).parents[1] / "data" / "ssrf-cases.json").read_text())


@pytest.mark.parametrize("url", CASES["refuse"])
def test_refused(url: str) -> None:
    with pytest.raises(TargetRefused):
        check_url(url)


@pytest.mark.parametrize("url", CASES["allow"])
def test_allowed(url: str) -> None:
    assert check_url(url) == url


def test_private_targets_pass_only_when_allowed() -> None:
    assert check_url("http://127.0.0.1:8080/hook", allow_private=True)
    with pytest.raises(TargetRefused):
        check_url("ftp://127.0.0.1/", allow_private=True)
    with pytest.raises(TargetRefused):
        check_url("http://user:pw@127.0.0.1/", allow_private=True)


def test_live_mode_can_require_https() -> None:
    with pytest.raises(TargetRefused, match="https"):
        check_url("http://8.8.8.8/", require_https=True)
    assert check_url("https://8.8.8.8/", require_https=True)
