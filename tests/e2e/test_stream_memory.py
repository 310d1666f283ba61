"""What an event stream holds for its client is bounded (audit 2, finding 5), over real HTTP
on both backends: twenty idle readers of a 28 MB run's stream grew the API by 1.2 GB and were
never dropped. Now a run's history goes out a page at a time, in writes of at most 1 MiB, a
client that takes no bytes for ``FLOWHOOK_STREAM_WRITE_TIMEOUT`` is dropped, and the run's
events are listed a page at a time like every list."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.support import serve

pytestmark = pytest.mark.e2e

BIG = 90_000
"""Characters of each of a step's two output fields: 36 steps make a history of 6.5 MB, more
than the kernel's buffers of a loopback connection take (4 MB to send, 4 KB to receive)."""
STEPS = 36


def _streams_open(client: httpx.Client) -> int:
    found = re.search(r"^flowhook_event_streams_open (\S+)$", client.get("/metrics").text, re.M)
    assert found is not None
    return int(float(found.group(1)))


def test_a_reader_that_stops_reading_is_dropped(tmp_path: Path, database_url: str) -> None:
    env = {"FLOWHOOK_STREAM_WRITE_TIMEOUT": "1", "FLOWHOOK_LOG_LEVEL": "warning"}
    with serve(tmp_path, database_url, **env) as server:
        key = server.value("sandbox key")
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.base, timeout=30, headers=auth) as client:
            steps = [
                {
                    "id": f"s{i}",
                    "type": "transform",
                    "output": {k: f"{{{{ '{k}' * {BIG} }}}}" for k in "ab"},
                }
                for i in range(STEPS)
            ]
            steps.append({"id": "hold", "type": "wait", "signal": "never"})
            r = client.post("/api/v1/flows", json={"name": "large history", "steps": steps})
            assert r.status_code == 201, r.text
            r = client.post(
                "/api/v1/flows/execute", json={"flow_id": r.json()["flow_id"], "payload": {}}
            )
            run_id = r.json()["run_id"]
            deadline = time.monotonic() + 60
            while True:
                run = client.get(f"/api/v1/flows/runs/{run_id}").json()
                assert run["status"] in ("queued", "running"), run["error"]
                if [s["id"] for s in run["steps"]][-1:] == ["hold"]:
                    break
                assert time.monotonic() < deadline, "the run did not reach its wait"
                time.sleep(0.1)

            # the events, listed a page at a time over HTTP
            first = client.get(f"/api/v1/flows/runs/{run_id}/events", params={"limit": 5}).json()
            assert len(first["data"]) == 5 and first["next_cursor"] == first["data"][-1]["id"]

            # A reader that sends its request, then reads nothing more.
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
            reader.connect(("127.0.0.1", server.port))
            request = (
                f"GET /api/v1/flows/runs/{run_id}/stream HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {key}\r\n\r\n"
            )
            reader.sendall(request.encode())
            try:
                deadline = time.monotonic() + 60
                while _streams_open(client) != 1:  # the server took it
                    assert time.monotonic() < deadline, "the stream never opened"
                    time.sleep(0.05)
                while _streams_open(client) != 0:  # dropped: a second without progress
                    assert time.monotonic() < deadline, "a reader reading nothing was kept"
                    time.sleep(0.1)
                # what it did get stops short of the history; then the connection is closed
                received = b""
                reader.settimeout(30)
                while chunk := reader.recv(1 << 16):
                    received += chunk
                assert b"200 OK" in received
                assert 0 < received.count(b"event: flow.step_completed") < STEPS
            finally:
                reader.close()

            # a reader that reads gets the whole history, in bounded writes
            events = 0
            with client.stream("GET", f"/api/v1/flows/runs/{run_id}/stream") as r:
                for line in r.iter_lines():
                    events += line.startswith("event: flow.step_completed")
                    if events == STEPS:
                        break
            assert events == STEPS
