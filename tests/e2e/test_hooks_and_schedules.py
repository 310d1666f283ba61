"""Over real HTTP: an inbound hook starts a run (and a bad signature does not); a schedule
ticking every second, with two server processes running schedulers on one database, starts
exactly one run per tick."""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serve, wait_for

pytestmark = pytest.mark.e2e


def test_inbound_hook_over_http(tmp_path: Path, database_url: str) -> None:
    with serve(tmp_path, database_url, FLOWHOOK_LOG_LEVEL="warning") as server:
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        with httpx.Client(base_url=server.base, timeout=10) as c:
            hook = c.post(
                "/api/v1/hooks",
                json={"flow_id": server.value("example flow"), "verify": {"type": "hmac"}},
                headers=auth,
            ).json()
            body = b'{"order_id": "ord_in", "amount": 3}'
            good = hmac.new(hook["verify"]["secret"].encode(), body, hashlib.sha256).hexdigest()
            bad = c.post(
                hook["url"],
                content=body,
                headers={"Content-Type": "application/json", "X-Signature": "0" * 64},
            )
            assert bad.status_code == 401
            r = c.post(
                hook["url"],
                content=body,
                headers={"Content-Type": "application/json", "X-Signature": good},
            )
            assert r.status_code == 202
            run_id = r.json()["run_id"]
            for _ in range(100):
                run = c.get(f"/api/v1/flows/runs/{run_id}", params={"wait": 5}, headers=auth).json()
                if run["status"] == "completed":
                    break
            assert (run["trigger"], run["output"]["order_id"]) == ("webhook", "ord_in")
            delivered = c.get(
                "/api/v1/events", params={"event": "webhook.delivered"}, headers=auth
            ).json()["data"]
            reasons = sorted(str(e["body"]["payload"]["reason"]) for e in delivered)
            assert reasons == ["None", "bad signature"]
            received = c.get(
                "/api/v1/events", params={"event": "webhook.received"}, headers=auth
            ).json()["data"]
            assert [e["body"]["run_id"] for e in received] == [run_id]
            runs = c.get("/api/v1/flows/runs", headers=auth).json()["data"]
            assert [x["run_id"] for x in runs] == [run_id]


def test_two_processes_one_run_per_tick(tmp_path: Path, database_url: str) -> None:
    env = {"FLOWHOOK_LOG_LEVEL": "warning", "FLOWHOOK_MIN_SCHEDULE_SECONDS": "1"}
    with ExitStack() as stack:
        first = stack.enter_context(serve(tmp_path, database_url, **env))
        second = stack.enter_context(serve(tmp_path, database_url, **env))
        auth = {"Authorization": f"Bearer {first.value('sandbox key')}"}
        flow_id = first.value("example flow")
        with httpx.Client(timeout=10, headers=auth) as c:
            assert (
                c.get(f"{second.base}/api/v1/flows/{flow_id}").status_code == 200
            )  # same database
            begun = time.time()
            c.post(
                f"{first.base}/api/v1/schedules",
                json={
                    "flow_id": flow_id,
                    "cron": "* * * * * *",
                    "payload": {"order_id": "tick", "amount": 1},
                },
            ).raise_for_status()

            def scheduled() -> list[dict[str, Any]]:
                runs = c.get(f"{first.base}/api/v1/flows/runs", params={"limit": 100}).json()
                return [r for r in runs["data"] if r["trigger"] == "schedule"]

            wait_for(lambda: len(scheduled()) >= 4, timeout=60, interval=0.2)
            c.patch(
                f"{first.base}/api/v1/schedules/"
                + c.get(f"{first.base}/api/v1/schedules").json()["data"][0]["id"],
                json={"enabled": False},
            ).raise_for_status()
            runs = scheduled()
            ended = time.time()
    # Two schedulers each tried every tick: one run per tick gives at most one run for each
    # whole second that began while the schedule was on (however slow the machine); two per
    # tick would give about twice that.
    ticks = math.floor(ended) - math.floor(begun)
    assert 4 <= len(runs) <= ticks + 1, (len(runs), ticks)
