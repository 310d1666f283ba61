"""The hottest route in plain ASGI: ``POST /api/v1/flows/execute`` (SPEC §4.1).

FastAPI's routing, dependency solving and Pydantic body model cost more than the rest of an
accept (authentication from memory, one row in a group commit) put together. So the request
guard hands this one route here first: a well-formed body is parsed with orjson, checked
field by field, and the run started through the same service call the FastAPI route makes.
Anything else (malformed JSON, a missing or mistyped field, an unknown field) is passed on,
body and all, to the FastAPI route, so every error answer stays exactly the one that route
gives, and the route keeps documenting the endpoint in OpenAPI.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from flowhook.api.errors import domain_error_response
from flowhook.api.models import run_accepted
from flowhook.api.responses import ORJSONResponse
from flowhook.errors import FlowhookError

__all__ = ["EXECUTE_PATH", "parse_execute", "handle_execute"]

EXECUTE_PATH = "/api/v1/flows/execute"
_FIELDS = frozenset({"flow_id", "trigger", "payload"})
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # digits → "0", others → " "
_LONG_NUMBER = b"0" * 20
"""orjson reads an integer beyond 64 bits as a float, silently; a body holding 20 digits in a
row goes to the model's parser instead, which keeps such an integer exact, so the service
refuses it there. (A translate and a substring search: a tenth of a regex's time.)"""


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
    scope: Scope, receive: Receive, send: Send, headers: dict[str, str], fallback: Any
) -> None:
    """Answer an execute request, or pass it to ``fallback`` (the FastAPI app) unchanged."""
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
    try:
        who = await services.keys.authenticate(headers.get("authorization"))
        started = await services.runs.start(
            who,
            flow_id=flow_id,
            payload=payload,
            trigger=trigger,
            idempotency_key=headers.get("idempotency-key"),
            parsed_by_orjson=True,
        )
    except FlowhookError as exc:
        await domain_error_response(exc)(scope, receive, send)
        return
    extra = {"Idempotent-Replayed": "true"} if started.replayed else None
    response = ORJSONResponse(run_accepted(started.run), status_code=202, headers=extra)
    await response(scope, receive, send)
