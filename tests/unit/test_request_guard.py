"""The request guard's checks before any route, its hand-off of fast routes, and the one 202
answer both execute paths give."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from starlette.types import Message, Receive, Scope, Send

from flowhook.api.fast import accepted
from flowhook.api.middleware import RequestGuard
from flowhook.service import Started
from flowhook.store.models import Mode, Run, RunStatus


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def _scope(method: str, path: str, headers: dict[str, str], query: bytes = b"") -> Scope:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": method, "path": path, "query_string": query, "headers": raw}


async def _call(guard: RequestGuard, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await guard(scope, receive, send)
    return sent


JSON = {"content-type": "application/json", "content-length": "2"}


@pytest.mark.parametrize(
    ("method", "path", "headers", "query", "refusal"),
    [
        ("GET", "/api/v1/flows", {}, b"", None),
        ("GET", "/api/v1/a\x00b", {}, b"", (400, "invalid_request")),
        ("GET", "/api/v1/flows", {}, b"x=%00", (400, "invalid_request")),
        ("POST", "/api/v1/flows", JSON, b"", None),
        ("POST", "/api/v1/flows", {**JSON, "content-length": "x"}, b"", (400, "invalid_request")),
        ("POST", "/api/v1/flows", {**JSON, "content-length": "11"}, b"", (413, "payload_too_large")),
        ("POST", "/api/v1/flows", {"content-length": "2"}, b"", (415, "unsupported_media_type")),
        ("POST", "/api/v1/flows", {"transfer-encoding": "chunked"}, b"", (415, "unsupported_media_type")),
        ("POST", "/api/v1/hooks/hk_abc", {"content-length": "2"}, b"", None),
        ("POST", "/login", {"content-length": "2"}, b"", None),
        ("DELETE", "/api/v1/flows", {"content-length": "2"}, b"", None),
        ("POST", "/api/v1/flows", {"content-length": "0"}, b"", None),
    ],
)  # fmt: skip
def test_refusals_before_any_route(
    method: str, path: str, headers: dict[str, str], query: bytes, refusal: tuple[int, str] | None
) -> None:
    guard = RequestGuard(_app, max_body=10)
    found = guard._refusal(_scope(method, path, headers, query), headers)
    assert (found and (found[0], found[2])) == refusal


async def test_a_fast_post_route_is_handed_the_request_and_the_app_as_fallback() -> None:
    calls: list[tuple[str, Any]] = []

    async def fast(
        scope: Scope, receive: Receive, send: Send, headers: dict[str, str], fallback: Any
    ) -> None:
        calls.append((headers["authorization"], fallback))
        await fallback(scope, receive, send)

    guard = RequestGuard(_app, max_body=10, fast_posts={"/api/v1/x": fast})
    headers = {**JSON, "authorization": "Bearer k"}
    sent = await _call(guard, _scope("POST", "/api/v1/x", headers))
    assert calls == [("Bearer k", _app)] and sent[-1]["body"] == b"app"
    assert sent[0]["headers"][-1][0] == b"x-request-id"
    await _call(guard, _scope("GET", "/api/v1/x", headers))  # only POST takes the fast route
    await _call(guard, _scope("POST", "/api/v1/y", headers))
    assert len(calls) == 1


async def test_a_refused_request_gets_the_error_body_with_its_request_id() -> None:
    guard = RequestGuard(_app, max_body=10)
    headers = {**JSON, "content-length": "99", "x-request-id": "req-1"}
    sent = await _call(guard, _scope("POST", "/api/v1/flows", headers))
    assert sent[0]["status"] == 413 and (b"x-request-id", b"req-1") in sent[0]["headers"]
    assert orjson.loads(sent[1]["body"]) == {
        "error": "request body over the limit of 10 bytes",
        "code": "payload_too_large",
    }


@pytest.mark.parametrize("replayed", [False, True])
def test_accepted_is_the_202_of_both_execute_paths(replayed: bool) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    run = Run(
        run_id="run_1", workspace_id="ws_1", mode=Mode.TEST, flow_id="wf_1", flow_version=1,
        trigger="api", status=RunStatus.QUEUED, payload={}, queued_at=now,
    )  # fmt: skip
    response = accepted(Started(run, replayed))
    assert response.status_code == 202
    assert orjson.loads(response.body)["run_id"] == "run_1"
    assert ("idempotent-replayed" in response.headers) is replayed
