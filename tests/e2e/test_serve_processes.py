"""`flowhook serve` as two cooperating processes (issue 18; PostgreSQL as well as SQLite): the API process and
the engine process it starts beside itself. A run completes with its webhook; events the
engine commits reach the API process's streams by the socket the two share (the streams'
catch-up read is set far beyond the test's patience, so nothing else could bring them);
SIGTERM stops both; `kill -9` of either stops the other, and a restart finishes the runs."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.conftest import new_pg_database
from tests.support import TEST_SECRET_KEY, Server, serve, wait_for

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


class Hook(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.seen.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Hook.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def engine_of(server: Server) -> int:
    (pid,) = [
        p
        for p in children(server.proc.pid)
        if b"engine" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
    ]
    return pid


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'serve.db'}"


ENV = {
    "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
    "FLOWHOOK_LOG_LEVEL": "warning",
    "FLOWHOOK_LEASE_SECONDS": "1.5",
    "FLOWHOOK_PLUGINS": "tests.plugins",
    "PYTHONPATH": str(ROOT),
}


def execute(client: httpx.Client, flow_id: str, n: int = 1) -> list[str]:
    ids = []
    for i in range(n):
        r = client.post(
            "/api/v1/flows/execute",
            json={"flow_id": flow_id, "payload": {"order_id": f"o{i}", "amount": i + 1}},
        )
        assert r.status_code == 202, r.text
        ids.append(r.json()["run_id"])
    return ids


def env_for(url: str) -> dict[str, str]:
    """The settings ``serve`` runs with here; PostgreSQL requires a secret key of its own."""
    return {**ENV, "FLOWHOOK_SECRET_KEY": TEST_SECRET_KEY} if url.startswith("postgres") else ENV


def status(client: httpx.Client, run_id: str) -> str:
    return str(client.get(f"/api/v1/flows/runs/{run_id}").json()["status"])


@pytest.fixture
def empty_pg() -> Iterator[str]:
    """A new, empty PostgreSQL database (``serve`` migrates it and makes its first keys)."""
    with new_pg_database() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def serve_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(request.getfixturevalue("empty_pg"))


def test_two_processes_run_a_flow_and_send_its_webhook(
    tmp_path: Path, receiver: str, serve_url: str
) -> None:
    """On both backends: on PostgreSQL too the API keeps its own process (and core)."""
    with serve(tmp_path, serve_url, split=True, **env_for(serve_url)) as server:
        engine = engine_of(server)
        assert engine != server.proc.pid and alive(engine)
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
            r = client.post(
                "/api/v1/webhooks/endpoints", json={"url": receiver, "events": ["flow.completed"]}
            )
            assert r.status_code == 201, r.text
            (run_id,) = execute(client, server.value("example flow"))
            [sent] = wait_for(lambda: [e for e in Hook.seen if e["run_id"] == run_id])
            assert sent["event"] == "flow.completed"
            assert status(client, run_id) == "completed"
    # SIGTERM (the helper's) stopped both, cleanly (uvicorn ends by raising the signal again)
    assert server.proc.returncode in (0, -signal.SIGTERM)
    wait_for(lambda: not alive(engine), timeout=10)


def test_events_the_engine_commits_reach_the_api_process_streams(tmp_path: Path) -> None:
    env = {**ENV, "FLOWHOOK_STREAM_POLL_INTERVAL": "60", "FLOWHOOK_STREAM_HEARTBEAT": "60"}
    with serve(tmp_path, sqlite_url(tmp_path), split=True, **env) as server:
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        flow_id = server.value("example flow")
        with (
            httpx.Client(base_url=server.base, headers=auth, timeout=30) as client,
            client.stream("GET", "/api/v1/events/stream") as stream,
        ):
            assert stream.status_code == 200
            (run_id,) = execute(client, flow_id)
            types: list[str] = []
            for line in stream.iter_lines():  # the read timeout (30 s) is below the poll (60 s)
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["run_id"] == run_id:
                        types.append(event["event"])
                        if event["event"] == "flow.completed":
                            break
            assert "flow.started" in types and types[-1] == "flow.completed"


def test_sigterm_to_the_engine_alone_stops_both(tmp_path: Path) -> None:
    with serve(tmp_path, sqlite_url(tmp_path), split=True, **ENV) as server:
        engine = engine_of(server)
        os.kill(engine, signal.SIGTERM)
        assert server.proc.wait(timeout=40) == 0  # an orderly stop, not a failure
        wait_for(lambda: not alive(engine), timeout=10)


def slow_flow(client: httpx.Client) -> str:
    definition = {
        "name": "slow",
        "steps": [
            {"id": "first", "type": "transform", "output": {"v": 1}},
            {"id": "pause", "type": "python", "function": "nap", "input": 1},
            {"id": "last", "type": "transform", "output": {"v": 2}},
        ],
    }
    r = client.post("/api/v1/flows", json=definition)
    assert r.status_code == 201, r.text
    return str(r.json()["flow_id"])


@pytest.mark.parametrize("victim", ["engine", "api"])
def test_kill_9_of_either_stops_the_other_and_a_restart_finishes_the_runs(
    tmp_path: Path, victim: str, serve_url: str
) -> None:
    url, env = serve_url, env_for(serve_url)
    with serve(tmp_path, url, split=True, **env) as server:
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        engine = engine_of(server)
        with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
            flow_id = slow_flow(client)
            run_ids = execute(client, flow_id, 5)
            wait_for(lambda: status(client, run_ids[0]) == "running")
        if victim == "engine":
            os.kill(engine, signal.SIGKILL)
            # the API process notices, drains and exits non-zero: its engine failed
            assert server.proc.wait(timeout=40) == 1
        else:
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait()
            wait_for(lambda: not alive(engine), timeout=10)  # the kernel killed it too
    with (
        serve(tmp_path, url, split=True, **env) as again,
        httpx.Client(base_url=again.base, headers=auth, timeout=10) as client,
    ):
        wait_for(lambda: all(status(client, r) == "completed" for r in run_ids), timeout=60)


def test_single_process_flag_runs_the_engine_inside(tmp_path: Path) -> None:
    with serve(tmp_path, sqlite_url(tmp_path), args=("--single-process",), **ENV) as server:
        assert children(server.proc.pid) == []
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
            (run_id,) = execute(client, server.value("example flow"))
            wait_for(lambda: status(client, run_id) == "completed")
