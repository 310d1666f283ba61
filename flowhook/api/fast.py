"""The hottest route in plain ASGI: ``POST /api/v1/flows/execute`` (SPEC §4.1).

FastAPI's routing, dependency solving and Pydantic body model cost more than the rest of an
accept (authentication from memory, one row in a group commit) put together. So
``create_app`` has the request guard hand this one route to :func:`handle_execute` first: a
well-formed body is parsed with orjson, checked field by field, and the run started through
the same service call the FastAPI route makes, answered by the same :func:`accepted`.
Anything else (malformed JSON, a missing or mistyped field, an unknown field) is passed on,
body and all, to the FastAPI route, so every error answer stays exactly the one that route
gives, and the route keeps documenting the endpoint in OpenAPI.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowhook import tracing
from flowhook.api.errors import domain_error_response
from flowhook.api.models import run_accepted
from flowhook.api.responses import ORJSONResponse
from flowhook.errors import FlowhookError
from flowhook.service import Started

__all__ = ["EXECUTE_PATH", "accepted", "parse_execute", "handle_execute"]

EXECUTE_PATH = "/api/v1/flows/execute"
_FIELDS = frozenset({"flow_id", "trigger", "payload"})
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # digits → "0", others → " "
_LONG_NUMBER = b"0" * 20
"""orjson reads an integer beyond 64 bits as a float, silently; a body holding 20 digits in a
row goes to the model's parser instead, which keeps such an integer exact, so the service
refuses it there. (A translate and a substring search: a tenth of a regex's time.)"""
_REPLAYED = {"Idempotent-Replayed": "true"}  # copied into each response's own headers


def accepted(started: Started) -> Response:
    """The 202 answer to a started run, on both paths (this one and the FastAPI route)."""
    headers = _REPLAYED if started.replayed else None
    return ORJSONResponse(run_accepted(started.run), status_code=202, headers=headers)


def parse_execute(body: bytes) -> tuple[str, str, dict[str, Any]] | None:
    """(flow_id, trigger, payload) of a body the FastAPI model would accept as it is, or
    ``None`` to let that model answer (and name what is wrong)."""
    if body.translate(_DIGITS).find(_LONG_NUMBER) >= 0:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(data) is not dict or not data.keys() <= _FIELDS:
        return None
    flow_id = data.get("flow_id")
    trigger = data.get("trigger", "api")
    payload = data.get("payload", {})
    if type(flow_id) is not str or type(trigger) is not str or type(payload) is not dict:
        return None
    return flow_id, trigger, payload


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def handle_execute(
    scope: Scope, receive: Receive, send: Send, headers: dict[str, str], fallback: ASGIApp
) -> None:
    """Answer an execute request, or pass it to ``fallback`` (the FastAPI app) unchanged."""
    began = time.time() if tracing.ENABLED else 0.0
    body = await _read_body(receive)
    parsed = parse_execute(body)
    if parsed is None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await fallback(scope, replay, send)
        return
    flow_id, trigger, payload = parsed
    services = scope["app"].state.services
    header = headers.get("traceparent")
    trace = tracing.accept(header) if header is not None or tracing.ENABLED else None
    try:
        who = await services.keys.authenticate(headers.get("authorization"))
        started = await services.runs.start(
            who,
            flow_id=flow_id,
            payload=payload,
            trigger=trigger,
            idempotency_key=headers.get("idempotency-key"),
            parsed_by_orjson=True,
            traceparent=None if trace is None else trace.stored,
        )
    except FlowhookError as exc:
        await domain_error_response(exc)(scope, receive, send)
        return
    await accepted(started)(scope, receive, send)
    if trace is not None and trace.span is not None:
        tracing.accepted_span(trace, began, started.run.run_id, flow_id, 202)
