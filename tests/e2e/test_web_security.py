"""The settings screen over real HTTP against `flowhook serve`: sign-in only from our own
pages (no login CSRF), framing and content rules on every page, when the session cookie is
Secure, and odd input answered with a 4xx page, never a 500."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support import Server, serve

pytestmark = pytest.mark.e2e

QUIET = {"FLOWHOOK_LOG_LEVEL": "warning"}


def sign_in(client: httpx.Client, key: str, **headers: str) -> httpx.Response:
    return client.post(
        "/signin",
        data={"api_key": key},
        headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
    )


@contextmanager
def signed_in(server: Server) -> Iterator[tuple[httpx.Client, str]]:
    """A client with a session, and the CSRF token of its forms."""
    with httpx.Client(base_url=server.base, timeout=10) as client:
        r = sign_in(client, server.value("sandbox key"), Origin=server.base)
        assert r.status_code == 303, r.text
        page = client.get("/flows")
        assert page.status_code == 200
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found is not None
        yield client, html.unescape(found.group(1))


def test_sign_in_only_from_our_own_pages(tmp_path: Path, database_url: str) -> None:
    # uvicorn trusts X-Forwarded-Proto from no one here, so a client's claim of https is not.
    with serve(tmp_path, database_url, FORWARDED_ALLOW_IPS="192.0.2.1", **QUIET) as server:
        key = server.value("sandbox key")
        with httpx.Client(base_url=server.base, timeout=10) as client:
            for headers in (
                {"Origin": "https://evil.example"},
                {"Origin": "null"},
                {"Origin": server.base.replace("127.0.0.1", "localhost")},
                {"Referer": "https://evil.example/login.html"},
                {},
            ):
                r = sign_in(client, key, **headers)
                assert r.status_code == 403, (headers, r.text)
                assert "Sign-in refused" in r.text
                assert "set-cookie" not in r.headers
                assert client.get("/runs").status_code == 303  # still signed out
            assert (
                "another site (https://evil.example)"
                in sign_in(client, key, Origin="https://evil.example").text
            )

            r = sign_in(client, key, Origin=server.base, **{"X-Forwarded-Proto": "https"})
            assert r.status_code == 303 and r.headers["location"] == "/overview"
            cookie = r.headers["set-cookie"]
            assert cookie.startswith("flowhook_session=") and "HttpOnly" in cookie
            assert "secure" not in cookie.lower()  # plain http, whatever the client claims
            assert client.get("/runs").status_code == 200

            # An old browser that sends only a Referer from our own page.
            with httpx.Client(base_url=server.base, timeout=10) as other:
                r = sign_in(other, key, Referer=f"{server.base}/signin")
                assert r.status_code == 303


def test_pages_forbid_framing_and_foreign_content(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'pages.db'}"
    with serve(tmp_path, db, **QUIET) as server, signed_in(server) as (client, _csrf):
        flow_id = server.value("example flow")
        for path in ("/signin", "/runs", f"/flows/{flow_id}", "/nowhere", "/static/app.js"):
            r = client.get(path)
            assert r.headers["x-frame-options"] == "DENY", path
            csp = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
            assert "unsafe-inline" not in csp
        r = client.get("/api/v1/flows", headers={"Authorization": "Bearer x"})
        assert "content-security-policy" not in r.headers  # JSON, and the API docs page


def test_secure_cookies_setting(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'secure.db'}"
    with (
        serve(tmp_path, db, FLOWHOOK_SECURE_COOKIES="true", **QUIET) as server,
        httpx.Client(base_url=server.base, timeout=10) as client,
    ):
        r = sign_in(client, server.value("sandbox key"), Origin=server.base)
        assert r.status_code == 303
        assert "; secure" in r.headers["set-cookie"].lower()


def test_odd_input_on_pages_is_a_4xx_page(tmp_path: Path, database_url: str) -> None:
    with serve(tmp_path, database_url, **QUIET) as server, signed_in(server) as (client, csrf):
        flow_id = server.value("example flow")
        for version in ("²", "12345678901234567890", "9" * 5000, "0", "-1", "1.5", "٣"):
            r = client.get(f"/flows/{flow_id}", params={"version": version})
            assert r.status_code == 400, (version, r.text)
            assert "version must be a whole number from 1 to 2000000000" in r.text
        assert client.get(f"/flows/{flow_id}", params={"version": "1"}).status_code == 200

        start = f"/flows/{flow_id}/start"
        r = client.post(start, data={"csrf": "jeton-é", "payload": "{}"})
        assert r.status_code == 403, r.text
        assert "security token is missing or wrong" in r.text

        deep = '{"a": ' + "[" * 300 + "]" * 300 + "}"
        cases = {
            deep: "nests too deeply",
            '{"a": ' + "[" * 5000 + "]" * 5000 + "}": "nests too deeply",
            '{"a": NaN}': "NaN is not a JSON number",
            '{"a": -Infinity}': "-Infinity is not a JSON number",
            '{"a": 123456789012345678901234567890}': "integer too large to store",
            '{"a": ' + "9" * 5000 + "}": "The payload is not valid JSON",
            '{"a": "\\ud800"}': "cannot be stored",
            "[1]": "must be a JSON object",
        }
        for payload, message in cases.items():
            r = client.post(start, data={"csrf": csrf, "payload": payload})
            assert r.status_code == 400, (payload[:40], r.text)
            assert message in html.unescape(r.text), payload[:40]

        r = client.post(start, data={"csrf": csrf, "payload": '{"order_id": "o", "amount": 1}'})
        assert r.status_code == 303 and r.headers["location"].startswith("/runs/run_")


def test_the_flow_page_pauses_and_resumes_the_flow(tmp_path: Path, database_url: str) -> None:
    with serve(tmp_path, database_url, **QUIET) as server, signed_in(server) as (client, csrf):
        flow_id = server.value("example flow")
        assert "Pause</button>" in client.get(f"/flows/{flow_id}").text
        r = client.post(f"/flows/{flow_id}/pause", data={"csrf": "wrong"})
        assert r.status_code == 403, r.text  # a form without its token changes nothing
        r = client.post(f"/flows/{flow_id}/pause", data={"csrf": csrf})
        assert r.status_code == 303, r.text
        page = client.get(f"/flows/{flow_id}").text
        assert "<strong>Paused</strong>" in page and "Resume</button>" in page
        key = server.value("sandbox key")
        api = {"Authorization": f"Bearer {key}"}
        assert client.get(f"/api/v1/flows/{flow_id}", headers=api).json()["paused"] is True
        r = client.post(f"/flows/{flow_id}/resume", data={"csrf": csrf})
        assert r.status_code == 303, r.text
        assert client.get(f"/api/v1/flows/{flow_id}", headers=api).json()["paused"] is False
