"""A run's stream from the client side, against a real ``flowhook serve``: the SDK's sync and
async ``stream()`` (every event of the run, in order, ending at the terminal one, the same
bytes the webhooks carry; resumed with ``Last-Event-ID`` through a cut connection) and ``flowhook runs watch`` (a line per event off a terminal; the
live table under tmux, whose screen is captured into test-artifacts/)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from flowhook.client import AsyncClient, Client, StreamEvent
from tests.support import FLOWHOOK, Server, serve

pytestmark = pytest.mark.e2e
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ENV = {"FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true", "FLOWHOOK_LOG_LEVEL": "warning"}

FLOW = {
    "name": "Streamed",
    "steps": [
        {"id": "prepare", "type": "transform", "output": {"n": "{{ payload.n }}"}},
        {"id": "held", "type": "wait", "signal": "go", "match": {"n": "{{ payload.n }}"}},
        {
            "id": "fan",
            "type": "parallel",
            "branches": {
                "a": [{"id": "left", "type": "transform", "output": {"x": 1}}],
                "b": [{"id": "right", "type": "transform", "output": {"x": 2}}],
            },
        },
        {
            "id": "each",
            "type": "map",
            "items": "{{ [1, 2, 3] }}",
            "steps": [{"id": "square", "type": "transform", "output": {"y": "{{ item }}"}}],
        },
        {"id": "finish", "type": "transform", "output": {"ok": True}},
    ],
}
EXPECTED = Counter(
    ["flow.started", "flow.completed"] + ["flow.step_completed"] * 10
)  # prepare, held, left, right, fan, square ×3, each, finish


class Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        Receiver.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def until(what: str, check: Any, seconds: float = 20.0) -> Any:
    """Wait for ``check()`` to answer something true (a failure after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)
    return found


def held(client: Client, run_id: str) -> bool:
    steps = client.get_run(run_id).steps
    return any(s["id"] == "held" and s["status"] == "waiting" for s in steps)


def check_run_events(events: list[StreamEvent], run_id: str) -> None:
    assert Counter(e.event for e in events) == EXPECTED
    assert events[0].event == "flow.started" and events[-1].event == "flow.completed"
    assert [e.data["event"] for e in events] == [e.event for e in events]
    assert {e.run_id for e in events} == {run_id}
    assert len({e.id for e in events}) == len(events)
    steps = [e.payload["step_id"] for e in events if e.event == "flow.step_completed"]
    assert steps[:2] == ["prepare", "held"] and steps[-2:] == ["each", "finish"]
    nested = {(e.payload.get("parent"), e.payload.get("branch"), e.payload.get("index"))
              for e in events if e.payload.get("parent")}  # fmt: skip
    assert nested == {("fan", "a", None), ("fan", "b", None)} | {
        ("each", None, i) for i in range(3)
    }


def test_sdk_streams_of_a_real_run(tmp_path: Path, database_url: str, receiver: str) -> None:
    with (
        serve(tmp_path, database_url, **ENV) as server,
        Client(server.base, server.value("sandbox key")) as client,
    ):
        client.create_endpoint(receiver, [*EXPECTED])
        flow_id = client.create_flow(FLOW)["flow_id"]
        run_id = client.execute(flow_id, {"n": 1}).run_id
        live: list[StreamEvent] = []
        reader = threading.Thread(target=lambda: live.extend(client.stream(run_id)), daemon=True)
        reader.start()  # opened while the run goes on: history, then live events
        until("the run waits for its signal", lambda: held(client, run_id))
        assert reader.is_alive()  # the stream stays open while the run waits
        assert client.send_signal("go", {"n": 1}, run_id=run_id)["matched"] == 1
        reader.join(timeout=30)
        assert not reader.is_alive(), "the stream did not end after the run's terminal event"
        check_run_events(live, run_id)
        assert client.get_run(run_id).status == "completed"

        # after the end: the same events, byte for byte, then the stream ends
        again = list(client.stream(run_id))
        assert [(e.id, e.event, e.raw) for e in again] == [(e.id, e.event, e.raw) for e in live]

        async def read_async() -> list[StreamEvent]:
            async with AsyncClient(server.base, server.value("sandbox key")) as aclient:
                return [e async for e in aclient.stream(run_id)]

        from_async = asyncio.run(read_async())
        assert [(e.id, e.raw) for e in from_async] == [(e.id, e.raw) for e in live]
        rest = list(client.stream(run_id, last_event_id=live[4].id))
        assert [e.id for e in rest] == [e.id for e in live[5:]]

        # the webhooks carried the same envelopes, byte for byte
        until("every event delivered", lambda: len(Receiver.bodies) >= len(live))
        assert sorted(Receiver.bodies) == sorted(e.raw.encode() for e in live)


def cli_env(server: Server) -> dict[str, str]:
    return {
        **os.environ,
        "FLOWHOOK_URL": server.base,
        "FLOWHOOK_API_KEY": server.value("sandbox key"),
        "COLUMNS": "200",
    }


def test_runs_watch_without_a_terminal(tmp_path: Path) -> None:
    with (
        serve(tmp_path, f"sqlite:///{tmp_path / 'watch.db'}", **ENV) as server,
        Client(server.base, server.value("sandbox key")) as client,
    ):
        flow_id = client.create_flow(FLOW)["flow_id"]
        run_id = client.execute(flow_id, {"n": 2}).run_id
        watcher = subprocess.Popen(
            [FLOWHOOK, "runs", "watch", run_id],
            env=cli_env(server),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        until("the run waits for its signal", lambda: held(client, run_id))
        client.send_signal("go", {"n": 2}, run_id=run_id)
        out, errors = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, (out, errors)
        lines = out.splitlines()
        assert len(lines) == sum(EXPECTED.values()) + 1, out  # one per event, then the end
        assert "flow.started running (trigger api, version 1)" in lines[0]
        assert " flow.step_completed prepare transform completed" in lines[1]
        assert any(" flow.step_completed left in fan[a] transform completed" in x for x in lines)
        assert any(" flow.step_completed square in each[2] transform completed" in x for x in lines)
        assert " flow.completed completed in " in lines[-2]
        assert lines[-1].startswith("completed in ")

        failing = client.create_flow(
            {"name": "Fails", "steps": [{"id": "x", "type": "fail", "message": "nope"}]}
        )
        failed_run = client.execute(failing["flow_id"]).run_id
        done = subprocess.run(
            [FLOWHOOK, "runs", "watch", failed_run],
            env=cli_env(server),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done  # as runs start --wait: 0 only when it completed
        assert "flow.step_failed x fail failed" in done.stdout and "nope" in done.stdout
        assert done.stdout.splitlines()[-1].startswith("failed in ")
        unknown = subprocess.run(
            [FLOWHOOK, "runs", "watch", "run_" + "0" * 26],
            env=cli_env(server),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert unknown.returncode == 1 and "404" in unknown.stderr


def tmux(*args: str) -> str:
    return subprocess.run(
        ["tmux", *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout


def test_runs_watch_live_table_under_tmux(tmp_path: Path, database_url: str) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing: apt-get install -y tmux (.ci/run does)")
    ARTIFACTS.mkdir(exist_ok=True)
    backend = database_url.split(":", 1)[0]
    session = f"flowhook-watch-{uuid.uuid4().hex[:8]}"
    exit_file = tmp_path / "exit-code"
    with (
        serve(tmp_path, database_url, **ENV) as server,
        Client(server.base, server.value("sandbox key")) as client,
    ):
        flow_id = client.create_flow(FLOW)["flow_id"]
        run_id = client.execute(flow_id, {"n": 3}).run_id
        env = cli_env(server)
        command = (
            " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith("FLOWHOOK_"))
            + f" {shlex.quote(FLOWHOOK)} runs watch {run_id}; echo $? > {exit_file}; sleep 600"
        )
        # the pane's own size, not COLUMNS/LINES a test runner may have set
        tmux("-L", session, "new-session", "-d", "-s", session, "-x", "120", "-y", "40",
             "env", "-u", "COLUMNS", "-u", "LINES", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}",
             "sh", "-c", command)  # fmt: skip
        try:
            # while the run waits for its signal, the table says so
            waiting = until(
                "the table shows the held step waiting",
                lambda: _screen_with(session, "held", "waiting"),
            )
            (ARTIFACTS / f"runs-watch-waiting-{backend}.txt").write_text(waiting)
            assert _row(waiting, "prepare", "completed") and "running" in waiting
            client.send_signal("go", {"n": 3}, run_id=run_id)
            until("runs watch exits", exit_file.exists, 60)
            until("the exit code is written", lambda: exit_file.read_text().strip())
            screen = tmux("-L", session, "capture-pane", "-p", "-t", session)
        finally:
            subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True, timeout=30)
    (ARTIFACTS / f"runs-watch-{backend}.txt").write_text(screen)
    assert exit_file.read_text().strip() == "0", screen
    for step in ("prepare", "held", "fan", "each", "finish"):
        assert _row(screen, step, "completed"), (step, screen)
    assert _row(screen, "left", "completed", "fan", "branch a"), screen
    assert _row(screen, "right", "completed", "fan", "branch b"), screen
    for i in range(3):
        assert _row(screen, "square", "completed", "each", f"index {i}"), screen
    assert run_id in screen and "completed in " in screen
    assert "waiting" not in screen and "running" not in screen


def _screen_with(session: str, *cells: str) -> str | None:
    screen = tmux("-L", session, "capture-pane", "-p", "-t", session)
    return screen if _row(screen, *cells) else None


def _row(screen: str, *cells: str) -> bool:
    """A table row holding these cells, in this order."""
    for line in screen.splitlines():
        parts = [p.strip() for p in line.replace("┃", "│").split("│")]
        at = 0
        for cell in cells:
            try:
                at = parts.index(cell, at) + 1
            except ValueError:
                break
        else:
            return True
    return False


def test_a_run_started_with_wait_prints_what_it_did(tmp_path: Path) -> None:
    """``runs start --wait --json`` follows the stream to the end and prints the run."""
    with serve(tmp_path, f"sqlite:///{tmp_path / 'w.db'}", **ENV) as server:
        with Client(server.base, server.value("sandbox key")) as client:
            flow = client.create_flow(
                {"name": "q", "steps": [{"id": "d", "type": "delay", "seconds": 0.5}]}
            )
        done = subprocess.run(
            [FLOWHOOK, "runs", "start", flow["flow_id"], "--wait", "--json"],
            env=cli_env(server),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done
        assert json.loads(done.stdout)["status"] == "completed"


class Cutter:
    """A TCP relay to the server on 127.0.0.1 that can cut every connection through it at
    once, as a proxy restarting would; it keeps each connection's request head."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.heads: list[bytes] = []
        self.open: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.open += [client, server]
            first = [True]
            threading.Thread(target=self._pump, args=(client, server, first), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, [False]), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, first: list[bool]) -> None:
        try:
            while data := source.recv(65536):
                if first[0]:
                    self.heads.append(data)
                    first[0] = False
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def cut(self) -> None:
        for s in self.open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.open = []

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_sdk_stream_resumes_through_a_cut_connection(tmp_path: Path, database_url: str) -> None:
    with (
        serve(tmp_path, database_url, **ENV) as server,
        Client(server.base, server.value("sandbox key")) as client,
    ):
        relay = Cutter(int(server.base.rsplit(":", 1)[1]))
        try:
            flow_id = client.create_flow(FLOW)["flow_id"]
            run_id = client.execute(flow_id, {"n": 4}).run_id
            until("the run waits for its signal", lambda: held(client, run_id))
            with Client(f"http://127.0.0.1:{relay.port}", server.value("sandbox key")) as far:
                stream = far.stream(run_id)
                got = [next(stream), next(stream)]  # flow.started, prepare: all there is yet
                assert [e.event for e in got] == ["flow.started", "flow.step_completed"]
                relay.cut()  # the connection drops while the run waits
                client.send_signal("go", {"n": 4}, run_id=run_id)
                got += list(stream)
        finally:
            relay.close()
        check_run_events(got, run_id)
        assert [e.id for e in got] == [e.id for e in client.stream(run_id)]
        assert len(relay.heads) == 2, relay.heads
        assert f"last-event-id: {got[1].id}".encode() in relay.heads[1].lower()
        assert b"last-event-id" not in relay.heads[0].lower()
