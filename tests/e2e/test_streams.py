"""Server-Sent Events over real HTTP: `flowhook serve` (and `api` beside `worker`) as
processes, streams read with a plain HTTP client and compared with the stored events."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from flowhook.ids import pack_id, unpack_id
from flowhook.store.models import envelope
from flowhook.store.types import from_micros
from tests.support import FLOWHOOK, Server, secret_key_env, serve, worker

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    "FLOWHOOK_PLUGINS": "tests.plugins",
    "PYTHONPATH": str(ROOT),
    "FLOWHOOK_LOG_LEVEL": "warning",
    "FLOWHOOK_STREAM_HEARTBEAT": "0.3",
}

Message = dict[str, Any]


def parse(raw: bytes) -> list[Message]:
    """SSE messages as the spec reads them: ``id``, ``event``, ``data`` (bytes, lines joined
    with LF), or ``comment`` for a comment-only block."""
    out: list[Message] = []
    for block in raw.split(b"\n\n"):
        if not block:
            continue
        msg: Message = {}
        data: list[bytes] = []
        for line in block.split(b"\n"):
            field, _, value = line.partition(b": ")
            if field == b"":
                msg["comment"] = value.decode()
            elif field == b"data":
                data.append(value)
            else:
                msg[field.decode()] = value.decode()
        if data:
            msg["data"] = b"\n".join(data)
        out.append(msg)
    return out


def events_only(messages: list[Message]) -> list[tuple[str, str, bytes]]:
    return [(m["id"], m["event"], m["data"]) for m in messages if "id" in m]


def stored(database_url: str, run_id: str | None = None) -> list[tuple[str, str, bytes]]:
    """(id, type, body) of the stored events (one run's, or all), oldest first: the body as
    the store gives it (rebuilt from the row, see flowhook.store.models.envelope)."""
    where = "WHERE run_id = $1" if run_id else "WHERE $1::bytea IS NULL"
    key = None if run_id is None else pack_id(run_id)  # ids are stored packed
    if database_url.startswith("sqlite"):
        conn = sqlite3.connect(database_url.removeprefix("sqlite:///"))
        conn.row_factory = sqlite3.Row
        try:
            sql = where.replace("$1::bytea", "?").replace("$1", "?")
            rows = conn.execute(f"SELECT * FROM events {sql} ORDER BY id", (key,))
            return [_body_of(r, from_micros(r["created_at"])) for r in rows]
        finally:
            conn.close()

    async def read() -> list[tuple[str, str, bytes]]:
        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            rows = await conn.fetch(f"SELECT * FROM events {where} ORDER BY id", key)
            return [_body_of(r, r["created_at"]) for r in rows]
        finally:
            await conn.close()

    return asyncio.run(read())


def _body_of(row: Any, created_at: datetime) -> tuple[str, str, bytes]:
    event_id = unpack_id(row["id"])
    if row["body"] is not None:
        return event_id, row["type"], bytes(row["body"])
    at = created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC)
    flow_id, run_id = (unpack_id(row[c]) if row[c] else None for c in ("flow_id", "run_id"))
    body = envelope(row["type"], flow_id, run_id, at, bytes(row["payload"]))
    return event_id, row["type"], body


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def naps_flow(c: httpx.Client, key: str, steps: int = 3, seconds: float = 0.2) -> str:
    body = {
        "name": "naps",
        "steps": [
            {"id": f"n{i}", "type": "python", "function": "nap", "input": seconds}
            for i in range(steps)
        ],
    }
    r = c.post("/api/v1/flows", json=body, headers=auth(key))
    assert r.status_code == 201, r.text
    return str(r.json()["flow_id"])


def start(c: httpx.Client, key: str, flow_id: str) -> str:
    r = c.post("/api/v1/flows/execute", json={"flow_id": flow_id}, headers=auth(key))
    assert r.status_code == 202, r.text
    return str(r.json()["run_id"])


def read_stream(
    server: Server, path: str, key: str, headers: dict[str, str] | None = None
) -> tuple[httpx.Response, bytes]:
    """The whole body of a stream that ends by itself."""
    with (
        httpx.Client(base_url=server.base, timeout=30) as c,
        c.stream("GET", path, headers={**auth(key), **(headers or {})}) as r,
    ):
        return r, r.read()


@pytest.fixture
def served(tmp_path: Path, database_url: str) -> Iterator[Server]:
    with serve(tmp_path, database_url, FLOWHOOK_MAX_STREAMS_PER_KEY="2", **ENV) as server:
        yield server


def test_a_run_stream_sends_the_stored_events_byte_for_byte_and_ends(
    served: Server, database_url: str
) -> None:
    key = served.value("sandbox key")
    with httpx.Client(base_url=served.base, timeout=30) as c:
        run_id = start(c, key, naps_flow(c, key))
    r, raw = read_stream(served, f"/api/v1/flows/runs/{run_id}/stream", key)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    messages = parse(raw)
    got = events_only(messages)
    assert got == stored(database_url, run_id)  # every one, in order, the very bytes
    assert [e[1] for e in got] == ["flow.started"] + ["flow.step_completed"] * 3 + [
        "flow.completed"
    ]
    assert all(m["comment"] == "keep-alive" for m in messages if "id" not in m)
    # A finished run's stream: its history, then the end.
    _, again = read_stream(served, f"/api/v1/flows/runs/{run_id}/stream", key)
    assert events_only(parse(again)) == got
    # Resume after the second event: the rest, and nothing else.
    _, rest = read_stream(
        served, f"/api/v1/flows/runs/{run_id}/stream", key, {"Last-Event-ID": got[1][0]}
    )
    assert events_only(parse(rest)) == got[2:]


def test_scope_and_refusals(served: Server, database_url: str) -> None:
    key, live = served.value("sandbox key"), served.value("live key")
    with httpx.Client(base_url=served.base, timeout=30) as c:
        run_id = start(c, key, naps_flow(c, key, steps=1, seconds=0))
        # Another mode's key does not see the run: the same 404 as reading it.
        r = c.get(f"/api/v1/flows/runs/{run_id}/stream", headers=auth(live))
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        assert c.get(f"/api/v1/flows/runs/{run_id}", headers=auth(live)).status_code == 404
        r = c.get(f"/api/v1/flows/runs/{run_id}/stream")
        assert r.status_code == 401
        r = c.get(
            f"/api/v1/flows/runs/{run_id}/stream",
            headers={**auth(key), "Last-Event-ID": "nonsense"},
        )
        assert r.status_code == 400 and r.json()["code"] == "invalid_request"
        r = c.get("/api/v1/events/stream?event=flow.nope", headers=auth(key))
        assert r.status_code == 400


def test_the_cap_on_open_streams_answers_429(served: Server) -> None:
    key = served.value("sandbox key")
    with (
        httpx.Client(base_url=served.base, timeout=30) as c,
        c.stream("GET", "/api/v1/events/stream", headers=auth(key)) as one,
    ):
        assert one.status_code == 200
        with c.stream("GET", "/api/v1/events/stream", headers=auth(key)) as two:
            assert two.status_code == 200
            third = c.get("/api/v1/events/stream", headers=auth(key))
            assert third.status_code == 429
            assert set(third.json()) == {"error", "code"}
            assert third.json()["code"] == "rate_limited"
            assert "FLOWHOOK_MAX_STREAMS_PER_KEY" in third.json()["error"]
        # One closed: room for another. Its first bytes are the heartbeat of an idle stream.
        with c.stream("GET", "/api/v1/events/stream", headers=auth(key)) as again:
            assert again.status_code == 200
            first = next(again.iter_raw())
            assert first == b": keep-alive\n\n"


def test_the_events_stream_follows_the_workspace_with_filters_and_resumes(
    served: Server, database_url: str
) -> None:
    key = served.value("sandbox key")
    with httpx.Client(base_url=served.base, timeout=30) as c:
        flow_id = naps_flow(c, key, steps=2, seconds=0)
        got: list[bytes] = []
        with c.stream("GET", "/api/v1/events/stream?event=flow.completed", headers=auth(key)) as s:
            assert s.status_code == 200
            runs = [start(c, key, flow_id) for _ in range(3)]
            for chunk in s.iter_raw():
                got.append(chunk)
                if b"".join(got).count(b"event: flow.completed") == 3:
                    break
        completed = events_only(parse(b"".join(got)))
        everything = [e for e in stored(database_url) if e[1] == "flow.completed"]
        assert completed == [e for e in everything if any(r in e[2].decode() for r in runs)]
        # Resume from the first: the other two come first, from the table.
        with c.stream(
            "GET",
            "/api/v1/events/stream?event=flow.completed",
            headers={**auth(key), "Last-Event-ID": completed[0][0]},
        ) as s:
            got = []
            for chunk in s.iter_raw():
                got.append(chunk)
                if b"".join(got).count(b"event: flow.completed") == 2:
                    break
        assert events_only(parse(b"".join(got))) == completed[1:]


def hold_open(server: Server, path: str, key: str, ended: list[str]) -> threading.Thread:
    """Read a stream in a thread until it ends; record how. Returns once it is open."""
    opened = threading.Event()

    def go() -> None:
        try:
            with (
                httpx.Client(base_url=server.base, timeout=60) as c,
                c.stream("GET", path, headers=auth(key)) as r,
            ):
                assert r.status_code == 200
                opened.set()
                for _ in r.iter_raw():
                    pass
            ended.append("ended")
        except httpx.HTTPError as exc:
            ended.append(f"error {type(exc).__name__}")

    t = threading.Thread(target=go, daemon=True)
    t.start()
    assert opened.wait(timeout=30)
    return t


@pytest.mark.parametrize("command", ["serve", "api"])
def test_sigterm_with_open_streams_exits_promptly(
    tmp_path: Path, database_url: str, command: str
) -> None:
    env = {**ENV, "FLOWHOOK_STREAM_HEARTBEAT": "15", "FLOWHOOK_SHUTDOWN_GRACE": "30"}
    with serve(tmp_path, database_url, **env) as seeded:
        key = seeded.value("sandbox key")
        with httpx.Client(base_url=seeded.base, timeout=30) as c:
            r = c.post(
                "/api/v1/flows",
                json={"name": "w", "steps": [{"id": "w", "type": "wait", "signal": "never"}]},
                headers=auth(key),
            )
            flow_id = r.json()["flow_id"]
    with serve(tmp_path, database_url, command, split=True, **env) as server:
        with httpx.Client(base_url=server.base, timeout=30) as c:
            run_id = start(c, key, flow_id)  # waits for a signal (serve) or stays queued (api)
        ended: list[str] = []
        threads = [
            hold_open(server, f"/api/v1/flows/runs/{run_id}/stream", key, ended),
            hold_open(server, "/api/v1/events/stream", key, ended),
        ]
        with httpx.Client(base_url=server.base, timeout=30) as c:
            r = c.get(f"/api/v1/flows/runs/{run_id}/events", headers=auth(key))
            assert r.status_code == 200  # the server answers beside the open streams
        server.proc.send_signal(signal.SIGTERM)
        # Without the streams' ending, uvicorn would wait out its graceful timeout (30 s).
        server.proc.wait(timeout=10)
        for t in threads:
            t.join(timeout=10)
        assert sorted(ended) == ["ended", "ended"]


def new_key(database_url: str) -> str:
    out = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--json", "--database-url", database_url],
        env={**os.environ, **secret_key_env(database_url)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return str(json.loads(out.stdout)["key"])


def test_api_and_worker_processes(tmp_path: Path, database_url: str) -> None:
    """The worker commits the events; the API process hears of them by NOTIFY on PostgreSQL,
    by its catch-up read on SQLite."""
    pg_url = database_url
    # PostgreSQL: no catch-up read (of the hub, or of the run's stream at its heartbeat)
    # before the client's 30 s read timeout, so the events came by NOTIFY.
    slow = "0.2" if database_url.startswith("sqlite") else "60"
    env = {**ENV, "FLOWHOOK_STREAM_POLL_INTERVAL": slow, "FLOWHOOK_STREAM_HEARTBEAT": slow}
    key = new_key(pg_url)
    with (
        serve(tmp_path, pg_url, "api", **env) as api,
        worker(tmp_path, pg_url, **env),
        httpx.Client(base_url=api.base, timeout=30) as c,
    ):
        flow_id = naps_flow(c, key, steps=3, seconds=0.3)
        run_id = start(c, key, flow_id)
        with c.stream("GET", f"/api/v1/flows/runs/{run_id}/stream", headers=auth(key)) as s:
            raw = s.read()
        # The stream opened while the run was still going: most events came live.
        assert events_only(parse(raw)) == stored(pg_url, run_id)
        assert [e[1] for e in events_only(parse(raw))][-1] == "flow.completed"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


STREAMS = 200
RUNS = 20
RSS_BOUND_KIB = 48 * 1024
"""What 200 open streams (and the events they carry) may add to the API process's resident
memory: under 0.25 MiB a stream (measured: about 11 MiB for the 200)."""


def test_200_streams_on_one_process_get_every_event(tmp_path: Path, database_url: str) -> None:
    env = {**ENV, "FLOWHOOK_MAX_STREAMS_PER_KEY": str(STREAMS), "FLOWHOOK_RATE_LIMIT": "0"}
    with serve(tmp_path, database_url, split=True, **env) as server:  # the API process's RSS
        key = server.value("sandbox key")
        with httpx.Client(base_url=server.base, timeout=30) as c:
            flow_id = naps_flow(c, key, steps=2, seconds=0)
            start(c, key, flow_id)  # warm up: the first run's costs are not the streams'
        before = rss_kib(server.proc.pid)
        got, peak = asyncio.run(_many_streams(server, key, flow_id))
        after = rss_kib(server.proc.pid)
    runs = set(got.pop("runs"))
    wanted = [e for e in stored(database_url) if any(r in e[2].decode() for r in runs)]
    assert len(wanted) == RUNS * 4
    for received in got.values():
        assert received == wanted  # every stream, every event, in commit order
    print(f"RSS before {before} KiB, with {STREAMS} streams {peak} KiB, after {after} KiB")
    assert peak - before < RSS_BOUND_KIB


async def _many_streams(server: Server, key: str, flow_id: str) -> tuple[dict[str, Any], int]:
    limits = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=STREAMS + 10)
    async with httpx.AsyncClient(base_url=server.base, timeout=60, limits=limits) as c:
        opened = 0
        all_open = asyncio.Event()
        results: dict[str, Any] = {}
        runs: list[str] = []

        async def follow(i: int) -> None:
            nonlocal opened
            buf = b""
            async with c.stream("GET", "/api/v1/events/stream", headers=auth(key)) as s:
                assert s.status_code == 200
                opened += 1
                if opened == STREAMS:
                    all_open.set()
                async for chunk in s.aiter_raw():
                    buf += chunk
                    if buf.count(b"event: flow.completed") >= RUNS:
                        break
            results[str(i)] = events_only(parse(buf))

        tasks = [asyncio.create_task(follow(i)) for i in range(STREAMS)]
        await all_open.wait()
        for _ in range(RUNS):
            r = await c.post("/api/v1/flows/execute", json={"flow_id": flow_id}, headers=auth(key))
            runs.append(r.json()["run_id"])
        peak = 0
        while not all(t.done() for t in tasks):
            peak = max(peak, rss_kib(server.proc.pid))
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        results["runs"] = runs
        return results, peak


def test_a_client_that_does_not_read_is_disconnected(tmp_path: Path, database_url: str) -> None:
    """A stream whose client stops reading is closed once its queue is full, not buffered
    without limit: the client finds the end of the connection after what was sent.

    The queue holds more than one run's events (eight, which one transaction may write), so
    the stream is not dropped while its client reads: the first run's events arrive whole.
    Then the client stops reading and the events outgrow what the sockets' buffers hold.
    """
    env = {**ENV, "FLOWHOOK_STREAM_QUEUE": "20", "FLOWHOOK_RATE_LIMIT": "0"}
    with serve(tmp_path, database_url, **env) as server:
        key = server.value("sandbox key")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
        sock.connect(("127.0.0.1", int(server.base.rsplit(":", 1)[1])))
        sock.sendall(
            b"GET /api/v1/events/stream HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {key}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 200")
        sock.settimeout(30)
        with httpx.Client(base_url=server.base, timeout=30) as c:
            # 300 runs' events are 14 MB: more than the kernel's send buffer grows to (4 MB).
            flow = {
                "name": "ballast",
                "steps": [
                    {"id": f"b{i}", "type": "python", "function": "ballast", "input": 8000}
                    for i in range(6)
                ],
            }
            r = c.post("/api/v1/flows", json=flow, headers=auth(key))
            assert r.status_code == 201, r.text
            flow_id = r.json()["flow_id"]
            first = start(c, key, flow_id)
            # While the client reads, the stream carries the run to its end.
            body = b""
            while b"event: flow.completed" not in body:  # the first run is the only one
                body += sock.recv(65536)
            read_while_reading = body.count(b"\nevent: ")
            assert read_while_reading == 8 and first.encode() in body
            # Now it stops reading.
            runs = [start(c, key, flow_id) for _ in range(300)]  # 2,400 events unread
            for _ in range(600):
                if c.get(f"/api/v1/flows/runs/{runs[-1]}", headers=auth(key)).json()["status"] in (
                    "completed",
                    "failed",
                ):
                    break
                time.sleep(0.1)
        # Read what was sent; a stream that was not cut goes on (heartbeats) past the guard.
        sock.settimeout(5)
        closed, guard = False, time.monotonic() + 60
        while time.monotonic() < guard:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            body += chunk
        sock.close()
        received = body.count(b"\nevent: ")
        assert closed, (received, len(body))
        assert read_while_reading <= received < 301 * 8  # cut short
