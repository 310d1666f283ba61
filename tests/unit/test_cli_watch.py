"""Following a run from the CLI (flowhook/cli_watch.py) over an injected transport: from the
stream, from an older server without one (404: long-polling as before), the step table and
the lines printed per event."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest
from rich.console import Console

from flowhook.cli_watch import Board, event_line, follow, wait_quietly, watch
from flowhook.client import Client, Run, StreamEvent

RUN = "run_1"


def envelope(name: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "event": name,
        "flow_id": "wf_1",
        "run_id": RUN,
        "timestamp": "2026-01-02T03:04:05.678Z",
        "payload": payload,
    }


def event(n: int, name: str, **payload: Any) -> StreamEvent:
    data = envelope(name, payload)
    return StreamEvent(f"evt_{n}", name, data, json.dumps(data))


def sse(*events: StreamEvent) -> bytes:
    return b"".join(f"id: {e.id}\nevent: {e.event}\ndata: {e.raw}\n\n".encode() for e in events)


STEP = {"id": "a", "type": "transform", "status": "completed", "duration_ms": 3, "attempts": 1}


def record(status: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "run_id": RUN,
        "flow_id": "wf_1",
        "status": status,
        "steps": steps,
        "duration_ms": 12 if status != "running" else None,
        "started_at": "2026-01-02T03:04:05Z",
        "error": {"message": "nope"} if status == "failed" else None,
    }


class Server:
    """Answers the run (the records in turn, the last one again) and its stream (``stream``
    bytes, or 404 like a server older than streams)."""

    def __init__(self, records: list[dict[str, Any]], stream: bytes | None) -> None:
        self.records = records
        self.stream = stream
        self.run_reads: list[dict[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/stream"):
            if self.stream is None:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(
                200, headers={"Content-Type": "text/event-stream"}, content=self.stream
            )
        self.run_reads.append(dict(request.url.params))
        body = self.records[min(len(self.run_reads), len(self.records)) - 1]
        return httpx.Response(200, json=body)

    def client(self) -> Client:
        return Client("http://flowhook.test", "k", transport=httpx.MockTransport(self))


def console(terminal: bool = False) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120, color_system=None), out


DONE = sse(event(1, "flow.started"), event(2, "flow.step_completed", step_id="a",
           type="transform", duration_ms=3), event(3, "flow.completed", status="completed",
           duration_ms=12))  # fmt: skip


def test_follow_reads_the_run_on_its_events() -> None:
    server = Server([record("running", []), record("completed", [STEP])], DONE)
    out_console, out = console()
    with server.client() as c:
        run = follow(c, RUN, 60, out_console)
    assert run.status == "completed"
    assert "✓ a transform completed 3 ms" in out.getvalue()
    assert all("wait" not in params for params in server.run_reads)  # no long-poll


def test_follow_says_why_the_run_waits_each_time_it_changes() -> None:
    asleep = {**record("running", []), "waiting_for": {
        "reason": "delay", "step_id": "nap", "until": "2026-01-02T03:05:00Z"}}  # fmt: skip
    retrying = {**record("running", []), "waiting_for": {
        "reason": "retry", "step_id": "call", "attempt": 2, "until": "2026-01-02T03:06:00Z"}}  # fmt: skip
    server = Server([asleep, asleep, retrying, record("completed", [STEP])], None)
    out_console, out = console()
    with server.client() as c:
        assert follow(c, RUN, 60, out_console).status == "completed"
    said = [line.strip() for line in out.getvalue().splitlines() if "waiting" in line]
    assert said == [
        "waiting for the delay in step nap until 2026-01-02T03:05:00Z",  # once, not per read
        "waiting to retry in step call (attempt 2) until 2026-01-02T03:06:00Z",
    ]


def test_follow_long_polls_a_server_without_streams() -> None:
    server = Server([record("running", []), record("completed", [STEP])], None)
    out_console, out = console()
    with server.client() as c:
        run = follow(c, RUN, 60, out_console)
    assert run.status == "completed" and "✓ a transform completed 3 ms" in out.getvalue()
    assert server.run_reads[-1] == {"wait": "2"}


def test_follow_long_polls_once_the_stream_gave_up() -> None:
    # every connection ends at once, without an event: the SDK gives up after 5 in a row
    server = Server([record("running", []), record("completed", [STEP])], b"retry: 1\n\n")
    out_console, _ = console()
    with server.client() as c:
        assert follow(c, RUN, 60, out_console).status == "completed"
    assert server.run_reads[-1] == {"wait": "2"}


@pytest.mark.parametrize("stream", [DONE, None], ids=["stream", "no stream"])
def test_wait_quietly(stream: bytes | None) -> None:
    server = Server([record("completed", [STEP])], stream)
    with server.client() as c:
        assert wait_quietly(c, RUN, 60).status == "completed"


def test_watch_prints_a_line_per_event_off_a_terminal() -> None:
    server = Server([record("running", []), record("completed", [STEP])], DONE)
    out_console, out = console()
    with server.client() as c:
        assert watch(c, RUN, out_console).status == "completed"
    assert out.getvalue().splitlines() == [
        "03:04:05.678 flow.started running (trigger None, version None)",
        "03:04:05.678 flow.step_completed a transform completed 3 ms",
        "03:04:05.678 flow.completed completed in 12 ms",
    ]


@pytest.mark.parametrize("stream", [DONE, None], ids=["stream", "no stream"])
def test_watch_draws_the_table_on_a_terminal(stream: bytes | None) -> None:
    server = Server([record("running", []), record("completed", [STEP])], stream)
    out_console, out = console(terminal=True)
    with server.client() as c:
        assert watch(c, RUN, out_console).status == "completed"
    last = out.getvalue().rsplit("run_1", 1)[1]  # the last drawing
    assert "completed  12 ms" in last and "│ a    │ transform │ completed │ 3 ms" in last


def test_the_board_moves_on_with_events() -> None:
    board = Board(Run.from_json(record("running", [STEP])))
    board.apply(event(1, "flow.step_failed", step_id="b", type="http", attempt=1,
                      will_retry=True, error={"message": "503"}))  # fmt: skip
    board.apply(event(2, "flow.step_completed", step_id="c", type="transform", duration_ms=1,
                      parent="fan", branch="x"))  # fmt: skip
    board.apply(event(3, "flow.step_completed", step_id="c", type="transform", duration_ms=2,
                      parent="each", index=0))  # fmt: skip
    board.apply(event(4, "flow.approval_requested", step_id="ok", message="Ship?"))
    rows = [(r.step_id, r.status, r.parent, r.where) for r in board.rows.values()]
    assert rows == [
        ("a", "completed", None, ""),
        ("b", "retrying", None, ""),
        ("c", "completed", "fan", "branch x"),
        ("c", "completed", "each", "index 0"),
        ("ok", "waiting", None, ""),
    ]
    board.apply(event(5, "flow.step_failed", step_id="b", type="http", attempt=2,
                      will_retry=False, error={"message": "503"}))  # fmt: skip
    assert board.rows[(None, None, None, "b")].status == "failed"
    board.apply(event(6, "flow.failed", status="failed", duration_ms=40))
    assert (board.run.status, board.run.duration_ms, board.run.terminal) == ("failed", 40, True)


def test_event_lines() -> None:
    line = event_line(event(1, "flow.step_failed", step_id="b", type="http", attempt=1,
                            will_retry=True, duration_ms=5, error={"message": "503"}))  # fmt: skip
    assert line == "03:04:05.678 flow.step_failed b http retrying 5 ms: 503"
    line = event_line(event(2, "flow.step_completed", step_id="sq", type="transform",
                            duration_ms=0, parent="each", index=2))  # fmt: skip
    assert line == "03:04:05.678 flow.step_completed sq in each[2] transform completed 0 ms"
    line = event_line(event(3, "flow.approval_requested", step_id="ok", message="Ship?"))
    assert line == "03:04:05.678 flow.approval_requested ok waiting for approval: Ship?"
    line = event_line(event(4, "flow.failed", status="failed", duration_ms=9,
                            error={"message": "boom"}))  # fmt: skip
    assert line == "03:04:05.678 flow.failed failed in 9 ms: boom"


def test_follow_shows_each_map_item_once_with_its_index() -> None:
    # Four items of one map run the same step id: --wait showed two of them "retrying" (the
    # others' statuses under one id) and dropped one; each is its own line now, as in watch.
    def item(i: int, status: str, ms: int | None) -> dict[str, Any]:
        return {"id": "ship", "type": "transform", "status": status, "duration_ms": ms,
                "attempts": 1, "parent": "each", "index": i}  # fmt: skip

    fan = {"id": "each", "type": "map", "status": "completed", "duration_ms": 40, "attempts": 1}
    running = [dict(fan, status="running", duration_ms=None), item(0, "completed", 5),
               item(1, "failed", 7), item(2, "completed", 9), item(3, "running", None)]  # fmt: skip
    done = [fan, item(0, "completed", 5), item(1, "completed", 8), item(2, "completed", 9),
            item(3, "completed", 11)]  # fmt: skip
    server = Server([record("running", running), record("completed", done)], sse())
    out_console, out = console()
    with server.client() as c:
        assert follow(c, RUN, 60, out_console).status == "completed"
    lines = [line.strip() for line in out.getvalue().splitlines() if "ship" in line]
    assert lines == [
        "✓ ship (each index 0) transform completed 5 ms",
        "✗ ship (each index 1) transform failed 7 ms",
        "✓ ship (each index 2) transform completed 9 ms",
        "✓ ship (each index 1) transform completed 8 ms",
        "✓ ship (each index 3) transform completed 11 ms",
    ], out.getvalue()
