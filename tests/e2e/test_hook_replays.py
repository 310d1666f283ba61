"""Over real HTTP, two server processes on one database: a Standard Webhooks delivery sent to
both starts one run, and forged requests do not lock the real sender out."""

from __future__ import annotations

import hashlib
import hmac
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.support import serve

pytestmark = pytest.mark.e2e


def test_a_replay_at_another_process_starts_no_second_run(
    tmp_path: Path, database_url: str
) -> None:
    env = {"FLOWHOOK_LOG_LEVEL": "warning"}
    with ExitStack() as stack:
        first = stack.enter_context(serve(tmp_path, database_url, **env))
        second = stack.enter_context(serve(tmp_path, database_url, **env))
        auth = {"Authorization": f"Bearer {first.value('sandbox key')}"}
        with httpx.Client(timeout=10) as c:
            hook = c.post(
                f"{first.base}/api/v1/hooks",
                json={"flow_id": first.value("example flow"), "verify": {"type": "standard"}},
                headers=auth,
            ).json()
            body = '{"order_id": "ord_replay", "amount": 2}'
            stamp = int(time.time())
            headers = {
                "Content-Type": "application/json",
                "webhook-id": "msg_replayed",
                "webhook-timestamp": str(stamp),
                "webhook-signature": Webhook(hook["verify"]["secret"]).sign(
                    "msg_replayed", datetime.fromtimestamp(stamp, tz=UTC), body
                ),
            }
            path = f"/api/v1/hooks/{hook['id']}"
            original = c.post(first.base + path, content=body, headers=headers)
            replay = c.post(second.base + path, content=body, headers=headers)
            assert original.status_code == 202, original.text
            assert replay.status_code == 200, replay.text
            assert replay.json() == {
                "run_id": original.json()["run_id"],
                "status": "queued",
                "duplicate": True,
            }
            runs = c.get(f"{first.base}/api/v1/flows/runs", headers=auth).json()["data"]
            assert [r["run_id"] for r in runs] == [original.json()["run_id"]]


def test_forged_requests_leave_the_sender_its_rate_limit(tmp_path: Path, database_url: str) -> None:
    with serve(tmp_path, database_url, FLOWHOOK_LOG_LEVEL="warning") as server:
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        with httpx.Client(base_url=server.base, timeout=10) as c:
            hook = c.post(
                "/api/v1/hooks",
                json={
                    "flow_id": server.value("example flow"),
                    "verify": {"type": "hmac"},
                    "rate_limit": 2,
                },
                headers=auth,
            ).json()
            url = f"/api/v1/hooks/{hook['id']}"
            body = b'{"order_id": "ord_real", "amount": 1}'
            json_type = {"Content-Type": "application/json"}
            forged = [
                c.post(url, content=body, headers={**json_type, "X-Signature": "f" * 64})
                for _ in range(5)
            ]
            assert [r.status_code for r in forged] == [401, 401, 429, 429, 429]
            good = hmac.new(hook["verify"]["secret"].encode(), body, hashlib.sha256).hexdigest()
            r = c.post(url, content=body, headers={**json_type, "X-Signature": good})
            assert r.status_code == 202, r.text
