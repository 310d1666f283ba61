"""Open event streams last only as long as what opened them (audit 2, finding 1): signing
out ends the run page's stream, and `flowhook keys revoke` from another process ends the
key's streams (the workspace's and a run's), promptly, though the key cache would trust the
key for 30 s and the heartbeat that checks again as a backstop is a minute away."""

from __future__ import annotations

import html
import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_key_revocation import cli
from tests.support import Server, serve

pytestmark = pytest.mark.e2e

ENDS_WITHIN = 10.0
"""Generous for a loaded machine: the streams end in about a second; the old code kept
them until the client left."""


class Reader(threading.Thread):
    """Reads one stream until the server ends it; ``opened`` once its answer began."""

    def __init__(self, base: str, path: str, **kw: object) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=120), **kw)  # type: ignore[arg-type]
        self.path = path
        self.opened = threading.Event()
        self.status = 0
        self.text = ""
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            with self.client.stream("GET", self.path) as r:
                self.status = r.status_code
                self.opened.set()
                for chunk in r.iter_text():
                    self.text += chunk
        except httpx.HTTPError:
            pass
        finally:
            self.ended_at = time.monotonic()
            self.opened.set()
            self.client.close()

    def open(self) -> Reader:
        self.start()
        assert self.opened.wait(10) and self.status == 200, (self.path, self.status)
        return self


def _waiting_run(client: httpx.Client) -> str:
    r = client.post(
        "/api/v1/flows",
        json={"name": "held", "steps": [{"id": "hold", "type": "wait", "signal": "never"}]},
    )
    assert r.status_code == 201, r.text
    r = client.post("/api/v1/flows/execute", json={"flow_id": r.json()["flow_id"], "payload": {}})
    assert r.status_code == 202, r.text
    return str(r.json()["run_id"])


def _sign_in(server: Server) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=server.base, timeout=10)
    r = client.post(
        "/signin",
        data={"api_key": server.value("sandbox key")},
        headers={"Origin": server.base},
    )
    assert r.status_code == 303, r.text
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/flows").text)
    assert found is not None
    return client, html.unescape(found.group(1))


def test_sign_out_and_revocation_end_open_streams(tmp_path: Path, database_url: str) -> None:
    env = {
        "FLOWHOOK_KEY_CACHE_SECONDS": "30",
        "FLOWHOOK_STREAM_HEARTBEAT": "60",
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    with serve(tmp_path, database_url, **env) as server:
        key = server.value("sandbox key")
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.base, timeout=10, headers=auth) as client:
            run_id = _waiting_run(client)
        browser, csrf = _sign_in(server)

        workspace = Reader(server.base, "/api/v1/events/stream", headers=auth).open()
        run = Reader(server.base, f"/api/v1/flows/runs/{run_id}/stream", headers=auth).open()
        page = Reader(server.base, f"/runs/{run_id}/stream", cookies=browser.cookies).open()

        # Signing out ends the page's stream; the key's streams go on.
        r = browser.post("/signout", data={"csrf": csrf})
        assert r.status_code == 303, r.text
        signed_out = time.monotonic()
        page.join(ENDS_WITHIN)
        assert not page.is_alive(), "the run page's stream outlived its session"
        assert workspace.is_alive() and run.is_alive()
        assert "flow.started" in page.text  # it was a working stream until then

        # Revoking the key from another process ends both of its streams.
        keys = json.loads(cli(database_url, "keys", "list", "--json"))
        (key_id,) = [k["id"] for k in keys if key.startswith(k["prefix"].rstrip("…"))]
        asked = time.monotonic()
        cli(database_url, "keys", "revoke", key_id)
        revoked = time.monotonic()
        for reader in (workspace, run):
            reader.join(max(0.0, revoked + ENDS_WITHIN - time.monotonic()))
            assert not reader.is_alive(), f"{reader.path} outlived its key's revocation"
        print(
            f"ended {page.ended_at - signed_out:.2f} s after sign-out; "
            f"{max(workspace.ended_at, run.ended_at) - asked:.2f} s after `keys revoke` began"
        )

        # A new stream of the revoked key is refused; one of the other key is not.
        with httpx.Client(base_url=server.base, timeout=10) as client:
            r = client.get("/api/v1/events/stream", headers=auth)
            assert r.status_code == 401
            live = {"Authorization": f"Bearer {server.value('live key')}"}
            with client.stream("GET", "/api/v1/events/stream", headers=live) as r:
                assert r.status_code == 200
        browser.close()
