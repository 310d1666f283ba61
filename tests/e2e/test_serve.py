"""The README's path over real HTTP: `flowhook serve` as a process, its first-start keys,
a run started with the spec's request and polled as SPEC §4.2 shows."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support import FLOWHOOK, serve

pytestmark = pytest.mark.e2e


def poll_run(client: httpx.Client, run_id: str, key: str) -> dict[str, object]:
    # The spec's polling pattern, faster: stop at a terminal status.
    for _ in range(300):
        r = client.get(f"/api/v1/flows/runs/{run_id}", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        body: dict[str, object] = r.json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return body
        time.sleep(0.05)
    raise AssertionError("run did not finish")


def test_first_start_prints_keys_and_the_example_flow_runs(
    tmp_path: Path, database_url: str
) -> None:
    with serve(tmp_path, database_url, split=True) as server:
        key = server.value("sandbox key")
        live = server.value("live key")
        flow_id = server.value("example flow")
        assert key.startswith("sk_test_") and live.startswith("sk_live_")
        assert "/api/v1/flows/execute" in server.printed("curl -s -X POST")
        with httpx.Client(base_url=server.base, timeout=10) as client:
            r = client.post(
                "/api/v1/flows/execute",
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                content=json.dumps(
                    {
                        "flow_id": flow_id,
                        "trigger": "api",
                        "payload": {"order_id": "ord_123", "amount": 42},
                    }
                ),
            )
            assert r.status_code == 202, r.text
            accepted = r.json()
            assert accepted["status"] == "queued"
            run = poll_run(client, accepted["run_id"], key)
            assert run["status"] == "completed"
            assert run["output"] == {"order_id": "ord_123", "total": 50.4}
            # The live key cannot see the sandbox run.
            r = client.get(
                f"/api/v1/flows/runs/{accepted['run_id']}",
                headers={"Authorization": f"Bearer {live}"},
            )
            assert r.status_code == 404
            assert client.get("/readyz").status_code == 200
    # A second start on the same database seeds nothing and prints no keys.
    with serve(tmp_path, database_url, split=True) as again:
        assert not any("sandbox key" in line for line in again.output)


def test_keys_create_json_for_scripts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    out = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "live", "--workspace", "ops", "--json", "--database-url", url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    body = json.loads(out.stdout)
    assert set(body) == {"key", "id", "workspace", "mode", "label"}
    assert (
        body["key"].startswith("sk_live_") and body["workspace"] == "ops" and body["mode"] == "live"
    )
    assert body["label"] is None
    labelled = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--workspace", "ops", "--label",
         "  CI [deploys]  ", "--database-url", url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert 'label "CI [deploys]"' in labelled.stdout  # trimmed; brackets printed as written
    listed = subprocess.run(
        [FLOWHOOK, "keys", "list", "--json", "--database-url", url],
        capture_output=True,
        text=True,
        check=True,
    )
    row, named = json.loads(listed.stdout)
    assert row["id"] == body["id"] and row["label"] is None and row["last_used_at"] is None
    assert named["label"] == "CI [deploys]" and named["mode"] == "test"
    assert body["key"] not in listed.stdout
    table = subprocess.run(
        [FLOWHOOK, "keys", "list", "--database-url", url], capture_output=True, text=True,
        env={**os.environ, "COLUMNS": "200"}, check=True,
    )  # fmt: skip
    assert "CI [deploys]" in table.stdout and "never" in table.stdout
    too_long = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--label", "x" * 101, "--database-url", url],
        capture_output=True, text=True,
    )  # fmt: skip
    assert too_long.returncode == 2 and "at most 100 characters" in too_long.stderr
    revoked = subprocess.run(
        [FLOWHOOK, "keys", "revoke", row["id"], "--database-url", url],
        capture_output=True,
        text=True,
    )
    assert revoked.returncode == 0
    bad = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "prod", "--database-url", url],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0


def _healthz(sock: socket.socket) -> bytes:
    """One whole answer to ``GET /healthz`` on ``sock`` (head and body)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return data


def test_an_idle_connection_is_kept_longer_than_clients_keep_theirs(tmp_path: Path) -> None:
    """A client reusing a connection idle for 6 s (past uvicorn's own 5 s, and httpx's) is
    answered, not reset; FLOWHOOK_HTTP_KEEP_ALIVE sets how long the server keeps one."""
    url = f"sqlite:///{tmp_path / 'ka.db'}"
    with serve(tmp_path, url) as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        assert _healthz(s).startswith(b"HTTP/1.1 200")
        time.sleep(6)
        assert _healthz(s).startswith(b"HTTP/1.1 200")
    with (
        serve(tmp_path, url, FLOWHOOK_HTTP_KEEP_ALIVE="1") as server,
        socket.create_connection(("127.0.0.1", server.port)) as s,
    ):
        assert _healthz(s).startswith(b"HTTP/1.1 200")
        s.settimeout(10)
        assert s.recv(4096) == b""  # closed by the server after 1 s idle
