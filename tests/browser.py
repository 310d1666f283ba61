"""The browser tests' Chromium (Debian's, driven by Playwright) and where their screenshots go;
the ``page`` fixture itself is in tests/e2e/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def browser_page() -> Iterator[Any]:
    """A tab at 1280×900 that accepts dialogs (confirm buttons); its pages'
    Content-Security-Policy must block nothing they do."""
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        tab.set_default_timeout(15_000)
        tab.on("dialog", lambda dialog: dialog.accept())
        refused: list[str] = []
        tab.on("console", lambda m: refused.append(m.text) if "Security Policy" in m.text else None)
        yield tab
        assert not refused, refused
        context.close()
        browser.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
