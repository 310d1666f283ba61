"""The one table that maps domain errors to HTTP, and the handlers that use it."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from flowhook import errors
from flowhook.api.allow import allowed_methods
from flowhook.api.responses import error_response

__all__ = ["STATUS", "install_error_handlers", "describe_validation_error", "domain_error_response"]

log = logging.getLogger("flowhook.api")

STATUS: dict[type[errors.FlowhookError], int] = {
    errors.InvalidInput: 400,
    errors.Unauthenticated: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.PayloadTooLarge: 413,
    errors.RateLimited: 429,
    errors.UnsupportedMediaType: 415,
    errors.StoreUnavailable: 503,
}


def status_of(exc: errors.FlowhookError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


_MESSAGES = {
    "missing": "is required",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "extra_forbidden": "is not a known field",
}


def _place(error: dict[str, Any], body: Any) -> str:
    """`` at line L, column C`` of a JSON error's position in ``body``, when both are known."""
    loc: tuple[Any, ...] = tuple(error.get("loc") or ())
    pos = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    if pos is None or not isinstance(body, str | bytes):
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f" at line {line}, column {column}"


def describe_validation_error(error: dict[str, Any], body: Any = None) -> tuple[str, str, str]:
    """(message, code, field) for one pydantic error, naming the field as a person writes it;
    malformed JSON by its line and column in ``body`` (the text that did not parse)."""
    if error.get("type") == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return (
            f"malformed JSON in the request body{_place(error, body)}: {detail}".rstrip(": "),
            "malformed_json",
            "body",
        )
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body",)]
    where = loc[0] if loc and loc[0] in ("query", "path", "header") else None
    if where:
        loc = loc[1:]
    field = ".".join(loc) or "body"
    text = _MESSAGES.get(error.get("type", ""), error.get("msg", "is invalid"))
    place = {"query": "query parameter ", "path": "path parameter ", "header": "header "}.get(
        where or "", ""
    )
    if field == "body":
        return f"the request body {text}", "invalid_request", field
    return f"{place}{field} {text}", "invalid_request", field


def domain_error_response(exc: errors.FlowhookError) -> Response:
    """The JSON answer for a domain error (``Retry-After`` on 429 and 503)."""
    status = status_of(exc)
    headers = {"Retry-After": "1"} if status == 503 else None
    if isinstance(exc, errors.RateLimited):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    problems = None
    if isinstance(exc, errors.InvalidDefinition):  # every problem, each where it lies
        problems = [{"field": p.field, "message": p.message} for p in exc.problems]
    elif isinstance(exc, errors.InvalidPayload):  # every field the input_schema refused
        problems = [{"field": field, "message": message} for field, message in exc.problems]
    return error_response(status, exc.message, exc.code, headers, problems)


HtmlErrorPage = Callable[[Request, int, str], Awaitable[Response]]


def install_error_handlers(app: FastAPI, html: HtmlErrorPage | None = None) -> None:
    """JSON errors for the API; ``html`` renders them for pages outside ``/api/``."""

    @app.exception_handler(errors.FlowhookError)
    async def _domain(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.FlowhookError)
        if html is not None and not request.url.path.startswith("/api/"):
            return await html(request, status_of(exc), exc.message)
        return domain_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        message, code, _field = describe_validation_error(dict(first), exc.body)
        return error_response(400, message, code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if html is not None and exc.status_code == 404 and not request.url.path.startswith("/api/"):
            return await html(request, 404, "There is no page here.")
        if exc.status_code == 404:
            return error_response(404, f"no route {request.url.path}", "not_found")
        if exc.status_code == 405:
            headers = dict(exc.headers or {})
            table = getattr(request.app.state, "allow", None) or []
            allow = allowed_methods(table, request.scope["path"])
            if allow:
                headers["Allow"] = allow
            return error_response(
                405,
                f"method {request.method} is not allowed on {request.url.path}",
                "method_not_allowed",
                headers,
            )
        if exc.status_code == 413:
            return error_response(413, str(exc.detail), "payload_too_large")
        return error_response(exc.status_code, str(exc.detail), "http_error")
