"""What makes an ``http`` step's request well-formed, checked on save for literal values and
again at run time for templated ones (so a bad value fails its step, never the worker)."""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["request_problem"]

# RFC 9110 §5.6.2: a method and a field name are tokens.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A field value may not carry a line break or NUL (header injection); tabs are allowed.
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def request_problem(method: str | None, headers: Mapping[str, object]) -> str | None:
    """Why the request cannot be sent as written, or None if it can."""
    if method is not None and not _TOKEN.fullmatch(method):
        return f"method {method!r} is not an HTTP method (letters only, such as GET or POST)"
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            return f"header name {name!r} is not valid (no spaces, colons or line breaks)"
        if _BAD_VALUE.search(str(value)):
            return f"header {name!r} has a line break or control character in its value"
    return None
