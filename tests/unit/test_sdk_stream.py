"""``Client.stream`` and ``AsyncClient.stream`` against a scripted HTTP server on 127.0.0.1 that
drops connections mid-stream: each reconnection carries ``Last-Event-ID``, no event is lost or
delivered twice, retries are bounded, and errors are the SDK's."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from flowhook.client import APIError, AsyncClient, Client, StreamError, StreamEvent

RUN = "run_abc"


def message(n: int, name: str = "flow.step_completed") -> bytes:
    body = json.dumps({"event": name, "flow_id": "wf_1", "run_id": RUN, "payload": {"n": n}})
    return f"id: evt_{n}\nevent: {name}\ndata: {body}\n\n".encode()


TERMINAL = message(9, "flow.completed")


@dataclass
class Reply:
    """What the server does with one connection: a status, then chunks (bytes to write, or a
    float to sleep), then it closes; ``chunked``: HTTP/1.1 chunks, so closing before the last
    chunk is a broken body rather than its end."""

    chunks: list[bytes | float] = field(default_factory=list)
    status: int = 200
    chunked: bool = False
    content_type: str = "text/event-stream"


class Scripted:
    """A tiny real HTTP server: connection i gets ``replies[i]`` (the last one again after
    the end); ``seen`` keeps each request's headers."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.seen: list[dict[str, str]] = []
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.seen.append({k.lower(): v for k, v in self.headers.items()})
                outer.paths.append(self.path)
                reply = outer.replies[min(len(outer.seen), len(outer.replies)) - 1]
                outer.answer(self, reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        handler.protocol_version = "HTTP/1.1" if reply.chunked else "HTTP/1.0"
        handler.send_response(reply.status)
        handler.send_header("Content-Type", reply.content_type)
        if reply.chunked:
            handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        try:
            for chunk in reply.chunks:
                if isinstance(chunk, float):
                    time.sleep(chunk)
                    continue
                data = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if reply.chunked else chunk
                handler.wfile.write(data)
                handler.wfile.flush()
        except OSError:
            pass  # the client went away first
        handler.close_connection = True

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def ids(events: list[StreamEvent]) -> list[str]:
    return [e.id for e in events]


FAST = b"retry: 5\n\n"  # reconnect after 5 ms (then 10, 20 …): the server's retry is honoured


def test_a_stream_to_its_terminal_event() -> None:
    replies = [Reply([FAST, message(1), b": heartbeat\n\n", message(2), TERMINAL])]
    with Scripted(replies) as server, Client(server.url, "sk_test_x") as client:
        events = list(client.stream(RUN))
    assert ids(events) == ["evt_1", "evt_2", "evt_9"]
    assert [e.event for e in events] == ["flow.step_completed"] * 2 + ["flow.completed"]
    assert events[0].data == {
        "event": "flow.step_completed", "flow_id": "wf_1", "run_id": RUN, "payload": {"n": 1}
    }  # fmt: skip
    assert (events[0].payload, events[0].run_id, events[-1].terminal) == ({"n": 1}, RUN, True)
    assert json.loads(events[1].raw) == events[1].data
    assert server.paths == [f"/api/v1/flows/runs/{RUN}/stream"]
    first = server.seen[0]
    assert first["accept"] == "text/event-stream" and "last-event-id" not in first
    assert first["authorization"] == "Bearer sk_test_x"


def test_it_stops_at_the_terminal_event_even_if_the_server_does_not_close() -> None:
    replies = [Reply([FAST, message(1), TERMINAL, 30.0])]
    with Scripted(replies) as server, Client(server.url, "k") as client:
        assert ids(list(client.stream(RUN))) == ["evt_1", "evt_9"]


@pytest.mark.parametrize("chunked", [False, True], ids=["closed", "broken"])
def test_a_dropped_connection_resumes_after_the_last_event(chunked: bool) -> None:
    half = message(3)[:20]  # a message cut off mid-way is not delivered: it comes again
    replies = [
        Reply([FAST, message(1), message(2), half], chunked=chunked),
        Reply([message(2), message(3), message(4)], chunked=chunked),  # 2 again: skipped
        Reply([message(5), TERMINAL], chunked=chunked),
    ]
    with Scripted(replies) as server, Client(server.url, "k") as client:
        events = list(client.stream(RUN))
    assert ids(events) == ["evt_1", "evt_2", "evt_3", "evt_4", "evt_5", "evt_9"]
    assert [h.get("last-event-id") for h in server.seen] == [None, "evt_2", "evt_4"]


def test_it_starts_after_a_given_event() -> None:
    with Scripted([Reply([TERMINAL])]) as server, Client(server.url, "k") as client:
        assert ids(list(client.stream(RUN, last_event_id="evt_8"))) == ["evt_9"]
    assert server.seen[0]["last-event-id"] == "evt_8"


def test_it_gives_up_after_max_retries_drops_in_a_row() -> None:
    replies = [Reply([FAST, message(1)]), Reply([b"retry: 1\n\n"])]
    with Scripted(replies) as server, Client(server.url, "k") as client:
        got: list[StreamEvent] = []
        stream = client.stream(RUN, max_retries=3)
        got.append(next(stream))
        with pytest.raises(StreamError) as caught:
            next(stream)
    assert ids(got) == ["evt_1"]
    assert len(server.seen) == 1 + 3
    assert caught.value.last_event_id == "evt_1" and caught.value.run_id == RUN
    assert "dropped 4 times in a row" in str(caught.value) and "evt_1" in str(caught.value)


def test_drops_count_anew_once_an_event_comes_through() -> None:
    # each connection brings one new event then drops: 5 drops, never 2 in a row
    replies = [Reply([FAST, message(n)]) for n in range(1, 6)] + [Reply([TERMINAL])]
    with Scripted(replies) as server, Client(server.url, "k") as client:
        events = list(client.stream(RUN, max_retries=1))
    assert ids(events) == [f"evt_{n}" for n in range(1, 6)] + ["evt_9"]


@pytest.mark.parametrize("status", [429, 503])
def test_a_reconnection_refused_for_now_is_tried_again(status: int) -> None:
    refused = Reply([b'{"error": "too many streams", "code": "rate_limited"}'], status=status,
                    content_type="application/json")  # fmt: skip
    replies = [Reply([FAST, message(1)]), refused, Reply([TERMINAL])]
    with Scripted(replies) as server, Client(server.url, "k") as client:
        assert ids(list(client.stream(RUN))) == ["evt_1", "evt_9"]
    assert [h.get("last-event-id") for h in server.seen] == [None, "evt_1", "evt_1"]


@pytest.mark.parametrize(
    ("status", "code"), [(404, "not_found"), (401, "unauthorized"), (429, "rate_limited")]
)
def test_errors_are_api_errors(status: int, code: str) -> None:
    body = json.dumps({"error": "no", "code": code}).encode()
    replies = [Reply([body], status=status, content_type="application/json")]
    with (
        Scripted(replies) as server,
        Client(server.url, "k") as client,
        pytest.raises(APIError) as caught,
    ):
        next(iter(client.stream(RUN)))
    assert (caught.value.status, caught.value.code, caught.value.error) == (status, code, "no")
    assert len(server.seen) == 1  # the first answer is final: no retry


def test_an_error_on_reconnection_that_no_retry_changes_is_raised() -> None:
    gone = Reply([b'{"error": "revoked", "code": "unauthorized"}'], status=401,
                 content_type="application/json")  # fmt: skip
    with Scripted([Reply([FAST, message(1)]), gone]) as server, Client(server.url, "k") as client:
        stream = client.stream(RUN)
        assert next(stream).id == "evt_1"
        with pytest.raises(APIError) as caught:
            next(stream)
    assert caught.value.status == 401 and len(server.seen) == 2


def test_an_answer_that_is_not_a_stream_is_an_error() -> None:
    replies = [Reply([b"{}"], content_type="application/json")]
    with (
        Scripted(replies) as server,
        Client(server.url, "k") as client,
        pytest.raises(APIError, match="text/event-stream"),
    ):
        list(client.stream(RUN))


@pytest.mark.parametrize("data", [b"{nope", b"[1]"])
def test_data_that_is_not_a_json_object_is_a_stream_error(data: bytes) -> None:
    with (
        Scripted([Reply([b"id: evt_1\ndata: " + data + b"\n\n"])]) as server,
        Client(server.url, "k") as client,
        pytest.raises(StreamError, match=r"evt_1 is not (a )?JSON"),
    ):
        list(client.stream(RUN))


def test_a_quiet_stream_past_the_read_timeout_reconnects() -> None:
    replies = [Reply([FAST, message(1), 5.0]), Reply([TERMINAL])]
    with Scripted(replies) as server, Client(server.url, "k") as client:
        events = list(client.stream(RUN, read_timeout=0.3))
    assert ids(events) == ["evt_1", "evt_9"]
    assert server.seen[1]["last-event-id"] == "evt_1"


def test_reads_wait_past_the_heartbeats_and_other_timeouts_stay() -> None:
    timeouts: list[dict[str, float]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=TERMINAL)

    transport = httpx.MockTransport(answer)
    with Client("http://flowhook.test", "k", timeout=5, transport=transport) as client:
        assert ids(list(client.stream(RUN))) == ["evt_9"]
    assert timeouts[0]["read"] >= 45  # a heartbeat comes every 15 s
    assert timeouts[0]["connect"] == 5


def test_no_server_at_all_is_the_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with Client(f"http://127.0.0.1:{port}", "k") as client, pytest.raises(httpx.ConnectError):
            list(client.stream(RUN))


async def test_the_async_stream_resumes_too() -> None:
    replies = [
        Reply([FAST, message(1), message(2)[:10]], chunked=True),
        Reply([message(2), b": heartbeat\n\n", TERMINAL]),
    ]
    with Scripted(replies) as server:
        async with AsyncClient(server.url, "k") as client:
            events = [e async for e in client.stream(RUN)]
    assert ids(events) == ["evt_1", "evt_2", "evt_9"]
    assert [h.get("last-event-id") for h in server.seen] == [None, "evt_1"]


async def test_the_async_stream_raises_the_sdk_errors() -> None:
    replies = [Reply([b'{"error": "no run", "code": "not_found"}'], status=404,
                     content_type="application/json")]  # fmt: skip
    with Scripted(replies) as server:
        async with AsyncClient(server.url, "k") as client:
            with pytest.raises(APIError) as caught:
                [e async for e in client.stream(RUN)]
    assert caught.value.status == 404
    replies = [Reply([FAST, message(1)]), Reply([b"retry: 1\n\n"])]
    with Scripted(replies) as server:
        async with AsyncClient(server.url, "k") as client:
            with pytest.raises(StreamError):
                [e async for e in client.stream(RUN, max_retries=2)]
    assert len(server.seen) == 3
