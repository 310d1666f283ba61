"""A key revoked by another process (`flowhook keys revoke` beside a running `serve`, on the
same SQLite file or PostgreSQL) stops working in the server within about a second, though
the server's key cache would trust it for 30 s."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support import FLOWHOOK, secret_key_env, serve

pytestmark = pytest.mark.e2e


def cli(database_url: str, *args: str) -> str:
    done = subprocess.run(
        [FLOWHOOK, *args],
        env={**os.environ, "FLOWHOOK_DATABASE_URL": database_url, **secret_key_env(database_url)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_revoked_elsewhere_stops_working_within_a_second(tmp_path: Path, database_url: str) -> None:
    env = {"FLOWHOOK_KEY_CACHE_SECONDS": "30", "FLOWHOOK_LOG_LEVEL": "warning"}
    with serve(tmp_path, database_url, **env) as server:
        key, live = server.value("sandbox key"), server.value("live key")
        flow_id = server.value("example flow")
        with httpx.Client(base_url=server.base, timeout=10) as client:

            def execute(with_key: str) -> int:
                r = client.post(
                    "/api/v1/flows/execute",
                    headers={"Authorization": f"Bearer {with_key}"},
                    json={"flow_id": flow_id, "payload": {"order_id": "o", "amount": 1}},
                )
                return r.status_code

            def listing(with_key: str) -> int:
                r = client.get("/api/v1/flows", headers={"Authorization": f"Bearer {with_key}"})
                return r.status_code

            # Both paths (the fast execute route and FastAPI's) now hold the key in the cache.
            assert execute(key) == 202 and listing(key) == 200 and listing(live) == 200

            keys = json.loads(cli(database_url, "keys", "list", "--json"))
            (key_id,) = [k["id"] for k in keys if key.startswith(k["prefix"].rstrip("…"))]
            cli(database_url, "keys", "revoke", key_id)  # a separate process

            revoked_at = time.monotonic()
            while execute(key) != 401:
                # Generous for a loaded machine; the cache alone would keep it for 30 s.
                assert time.monotonic() - revoked_at < 5, "revoked key still accepted"
                time.sleep(0.05)
            assert listing(key) == 401
            r = client.get("/api/v1/flows", headers={"Authorization": f"Bearer {key}"})
            assert r.json() == {"error": "unknown or revoked API key", "code": "unauthenticated"}
            assert listing(live) == 200  # the other key keeps working
