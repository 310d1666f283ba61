"""Pure-ASGI middleware: request ids, page headers, body limits and media type, and the last
word on unexpected errors (one log line with the request id; a 500 with no internals)."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowhook import logs
from flowhook.api.responses import error_response

__all__ = ["FastRoute", "RequestGuard"]

log = logging.getLogger("flowhook.api")


class _TooLarge(StarletteHTTPException):
    """Raised from ``receive`` when a streamed body passes the limit. An HTTPException, so
    FastAPI's body reader passes it through to the handlers instead of calling it a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the limit of {limit} bytes")


_PUBLIC_HOOK = re.compile(r"^/api/v1/hooks/hk_[0-9a-z]+/?$")
"""Inbound hooks take any body (forms, text) from the sender."""


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


FastRoute = Callable[[Scope, Receive, Send, dict[str, str], ASGIApp], Awaitable[None]]
"""A route answered in plain ASGI ahead of FastAPI's routing: ``(scope, receive, send,
headers, fallback)``, where ``fallback`` (the FastAPI app) may answer it instead."""


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body: int,
        json_prefix: str = "/api/",
        page_headers: list[tuple[bytes, bytes]] | None = None,
        fast_posts: Mapping[str, FastRoute] | None = None,
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.json_prefix = json_prefix
        self.page_headers = page_headers or []
        """Added to every answer outside ``json_prefix`` (the pages: framing, CSP)."""
        self.fast_posts = dict(fast_posts or {})
        """POST paths answered by a :data:`FastRoute` (``create_app`` gives the execute route)."""
        self._too_large = f"request body over the limit of {max_body} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:  # the first of a repeated header, as Starlette reads it
            headers.setdefault(k.decode("latin-1"), v.decode("latin-1"))
        request_id = headers.get("x-request-id", "")[:64] or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        logs.request_id.set(request_id)
        started = False
        extra = [(b"x-request-id", request_id.encode())]
        page = not scope["path"].startswith(self.json_prefix)

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                own = list(message.get("headers", []))
                if page:  # a header the page's route set wins over the pages' defaults
                    named = {k.lower() for k, _ in own}
                    own += (h for h in self.page_headers if h[0] not in named)
                message["headers"] = [*own, *extra]
            await send(message)

        async def reply(status: int, text: str, code: str) -> None:
            await error_response(status, text, code)(scope, receive, send_with_id)

        refused = self._refusal(scope, headers)
        if refused is not None:
            await reply(*refused)
            return
        seen = 0

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _TooLarge(self.max_body)
            return message

        try:
            fast = self.fast_posts.get(scope["path"]) if scope["method"] == "POST" else None
            if fast is not None:
                await fast(scope, counted_receive, send_with_id, headers, self.app)
            else:
                await self.app(scope, counted_receive, send_with_id)
        except _TooLarge:
            if not started:
                await reply(413, self._too_large, "payload_too_large")
        except Exception:
            log.exception(
                "unexpected error (request id %s) %s %s", request_id, scope["method"], scope["path"]
            )
            if not started:
                await reply(
                    500,
                    f"internal error; quote request id {request_id} when reporting it",
                    "internal",
                )

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """Why a request is answered before any route sees it, as (status, message, code):
        a NUL in the URL, a Content-Length that is no number or over the limit, a body that
        is not JSON where the API takes JSON. ``None`` for a request that may go on."""
        if "\x00" in scope["path"] or b"%00" in scope["query_string"]:
            return 400, "the URL must not contain the NUL character (%00)", "invalid_request"
        length = headers.get("content-length")
        has_body = (length is not None and length.strip() not in ("", "0")) or (
            "chunked" in headers.get("transfer-encoding", "").lower()
        )
        if not has_body or scope["method"] not in ("POST", "PUT", "PATCH"):
            return None
        if length is not None:
            try:
                too_big = int(length) > self.max_body
            except ValueError:
                return 400, "Content-Length is not a number", "invalid_request"
            if too_big:
                return 413, self._too_large, "payload_too_large"
        wants_json = scope["path"].startswith(self.json_prefix) and not _PUBLIC_HOOK.match(
            scope["path"]
        )
        if wants_json and not _is_json(headers.get("content-type", "")):
            return (
                415,
                "send the request body as JSON with Content-Type: application/json",
                "unsupported_media_type",
            )
        return None
