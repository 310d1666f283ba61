"""The SDK against a real server: execute, wait (SPEC §4.2 polling), errors, long-poll, and
verify_signature on real deliveries."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from flowhook.client import (
    APIError,
    Client,
    SignatureError,
    WaitTimeout,
    verify_signature,
    verify_webhook,
)
from tests.support import serve

pytestmark = pytest.mark.e2e


class Hook(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        Hook.seen.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_sdk_against_a_real_server(tmp_path: Path, database_url: str) -> None:
    Hook.seen = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    receiver.daemon_threads = True
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = {"FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true", "FLOWHOOK_LOG_LEVEL": "warning"}
    try:
        with (
            serve(tmp_path, database_url, **env) as server,
            Client(server.base, server.value("sandbox key")) as flowhook,
        ):
            endpoint = flowhook.create_endpoint(
                f"http://127.0.0.1:{receiver.server_address[1]}/hook", ["flow.completed"]
            )
            flow_id = server.value("example flow")
            accepted = flowhook.execute(
                flow_id, {"order_id": "ord_sdk", "amount": 2}, idempotency_key="k1"
            )
            assert accepted.status == "queued" and accepted.run_id.startswith("run_")
            assert (
                flowhook.execute(
                    flow_id, {"order_id": "ord_sdk", "amount": 2}, idempotency_key="k1"
                )
                == accepted
            )
            run = flowhook.wait(accepted.run_id, interval=0.05, max_attempts=100)
            assert run.status == "completed" and run.output == {"order_id": "ord_sdk", "total": 2.4}
            assert [r.run_id for r in flowhook.list_runs(flow_id=flow_id)] == [accepted.run_id]
            rerun = flowhook.rerun(accepted.run_id, from_step=run.steps[-1]["id"])
            rerun_run = flowhook.wait(rerun.run_id, interval=0.05, max_attempts=100)
            assert rerun_run.rerun_of == accepted.run_id and rerun_run.output == run.output
            assert [s["reused"] for s in rerun_run.steps][:-1] == [True] * (len(run.steps) - 1)
            # Long-poll answers when the run ends.
            slow = flowhook.create_flow(
                {"name": "s", "steps": [{"id": "w", "type": "delay", "seconds": 0.5}]}
            )
            started = flowhook.execute(slow["flow_id"])
            polled = httpx.get(
                f"{server.base}/api/v1/flows/runs/{started.run_id}",
                params={"wait": 10},
                headers={"Authorization": f"Bearer {server.value('sandbox key')}"},
                timeout=15,
            ).json()
            assert polled["status"] == "completed"
            with pytest.raises(WaitTimeout):
                flowhook.wait(
                    flowhook.execute(
                        flowhook.create_flow(
                            {"name": "l", "steps": [{"id": "w", "type": "delay", "seconds": 30}]}
                        )["flow_id"]
                    ).run_id,
                    interval=0.01,
                    max_attempts=3,
                )
            with pytest.raises(APIError) as info:
                flowhook.execute("wf_" + "0" * 26)
            assert (info.value.status, info.value.code) == (404, "not_found")
            import time

            for _ in range(200):
                if Hook.seen:
                    break
                time.sleep(0.05)
        headers, body = Hook.seen[0]
        assert verify_signature(body, headers["X-Service-Signature"], endpoint["secret"])
        verify_webhook(body, headers, endpoint["secret"])
        assert not verify_signature(body + b" ", headers["X-Service-Signature"], endpoint["secret"])
        with pytest.raises(SignatureError, match="does not match"):
            verify_webhook(body.replace(b"ord_sdk", b"ord_evil"), headers, endpoint["secret"])
        with pytest.raises(SignatureError, match="missing"):
            verify_webhook(body, {}, endpoint["secret"])
    finally:
        receiver.shutdown()
        receiver.server_close()
