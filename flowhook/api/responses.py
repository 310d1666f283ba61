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
    status: int, message: str, code: str, headers: dict[str, str] | None = None
) -> ORJSONResponse:
    return ORJSONResponse({"error": message, "code": code}, status_code=status, headers=headers)
