"""Settings → Secrets in a real browser (Playwright driving Debian's Chromium) against a real
`flowhook serve`, at desktop and phone width: names listed, a value set and replaced, never
shown back (not in the page, not in the form after a refusal). Screenshots:
test-artifacts/screenshots/secrets-*.png."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_workers_browser import shot
from tests.support import serve

pytestmark = pytest.mark.e2e

VALUE = "sk_live_browser_VALUE_93f1"


def test_the_secrets_page_lists_names_and_sets_values_never_showing_one(
    tmp_path: Path,
    page: Any,
) -> None:
    with serve(tmp_path, f"sqlite:///{tmp_path / 's.db'}", FLOWHOOK_LOG_LEVEL="warning") as server:
        base, key = server.base, server.value("sandbox key")
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=auth, timeout=30) as api:
            r = api.post("/api/v1/secrets", json={"name": "SLACK_TOKEN", "value": "xoxb-1-2-3"})
            assert r.status_code == 201, r.text

            page.goto(base + "/signin")
            page.fill("#api_key", key)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r"/overview$"))
            page.click("nav a[href='/settings/secrets']")
            page.wait_for_url(re.compile(r"/settings/secrets$"))
            assert page.get_attribute("nav a[aria-current=page]", "href") == "/settings/secrets"
            assert "SLACK_TOKEN" in page.inner_text("#secrets")
            assert "xoxb-1-2-3" not in page.content()

            # A new one: its name appears, its value nowhere.
            page.fill("#name", "STRIPE_KEY")
            page.fill("#value", VALUE)
            assert page.get_attribute("#value", "type") == "password"
            page.click("#set-secret button[type=submit]")
            page.wait_for_url(re.compile(r"/settings/secrets\?saved=STRIPE_KEY$"))
            assert "Saved STRIPE_KEY." in page.inner_text("p.notice")
            rows = page.locator("#secrets tbody tr").all_inner_texts()
            assert [row.split("\t")[0] for row in rows] == ["SLACK_TOKEN", "STRIPE_KEY"], rows
            assert page.input_value("#value") == ""
            assert VALUE not in page.content()
            shot(page, "secrets-01-listed")

            # The same name again sets a new value (the API's list shows the later time).
            before = {s["name"]: s for s in api.get("/api/v1/secrets").json()["data"]}
            page.fill("#name", "STRIPE_KEY")
            page.fill("#value", VALUE + "-2")
            page.click("#set-secret button[type=submit]")
            page.wait_for_url(re.compile(r"saved=STRIPE_KEY$"))
            after = {s["name"]: s for s in api.get("/api/v1/secrets").json()["data"]}
            assert after["STRIPE_KEY"]["updated_at"] > before["STRIPE_KEY"]["updated_at"]
            assert after["STRIPE_KEY"]["created_at"] == before["STRIPE_KEY"]["created_at"]
            assert VALUE not in page.content()

            # A bad name is refused, and the value typed is not given back in the form.
            page.evaluate("document.getElementById('name').removeAttribute('pattern')")
            page.fill("#name", "lower_case")
            page.fill("#value", VALUE)
            page.click("#set-secret button[type=submit]")
            assert "name must match" in page.inner_text("p.error")
            assert page.input_value("#value") == ""
            assert VALUE not in page.content()
            shot(page, "secrets-02-refused")

            # Delete.
            page.on("dialog", lambda d: d.accept())
            page.click("tr[data-secret=SLACK_TOKEN] button")
            page.wait_for_url(re.compile(r"deleted=SLACK_TOKEN$"))
            names = [s["name"] for s in api.get("/api/v1/secrets").json()["data"]]
            assert names == ["STRIPE_KEY"]
