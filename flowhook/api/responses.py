"""JSON responses rendered with orjson, and the error body every non-2xx answer carries."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

__all__ = ["ORJSONResponse", "error_response"]


class ORJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(
    status: int,
    message: str,
    code: str,
    headers: dict[str, str] | None = None,
    problems: list[dict[str, str | None]] | None = None,
) -> ORJSONResponse:
    """``{"error", "code"}``, and ``"errors"`` (``[{"field", "message"}, …]``) when the
    request had several problems, each told where it lies (a flow definition's)."""
    body: dict[str, object] = {"error": message, "code": code}
    if problems is not None:
        body["errors"] = problems
    return ORJSONResponse(body, status_code=status, headers=headers)
