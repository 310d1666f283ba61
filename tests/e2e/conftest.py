"""The browser tests' ``page`` (tests/browser.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser import browser_page


@pytest.fixture
def page() -> Iterator[Any]:
    yield from browser_page()
