"""JSON from outside that the store can keep: encoded once, here, before any transaction.

A body the request parsers accept may still hold what the store cannot write back: an integer
beyond 64 bits, nesting deeper than orjson writes, NaN or Infinity (orjson would store them as
``null``), or a NUL character (PostgreSQL's ``jsonb`` refuses ``\\u0000``). Such a value is
refused with :class:`InvalidInput` naming the field, instead of failing the commit it would
have shared with other requests.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from flowhook.errors import InvalidInput
from flowhook.store.types import json_has_nul

__all__ = ["encode_json", "check_json"]


def encode_json(value: Any, field: str, *, finite: bool = False) -> orjson.Fragment:
    """``value`` as JSON, ready for the store (a JSON column writes the fragment as it is).

    ``finite``: the value came from orjson's parser, which refuses NaN and Infinity, so the
    walk that looks for them is skipped (it would run on every payload holding a null)."""
    try:
        encoded = orjson.dumps(value)
    except TypeError as exc:
        raise InvalidInput(f"{field} {_why(str(exc))}", field=field) from None
    if json_has_nul(encoded):
        raise InvalidInput(f"{field} must not contain the NUL character (\\u0000)", field=field)
    if (
        not finite and encoded.find(b"null") >= 0 and _has_non_finite(value)
    ):  # orjson writes NaN, Inf as null
        raise InvalidInput(f"{field} must not contain NaN or Infinity", field=field)
    return orjson.Fragment(encoded)


def check_json(value: Any, field: str) -> None:
    """Raise :class:`InvalidInput` unless the store can keep ``value`` as it is."""
    encode_json(value, field)


def _why(message: str) -> str:
    if "64-bit" in message:
        return "holds an integer outside the 64-bit range (send it as a string)"
    if "Recursion" in message:
        return "is nested too deeply (at most 254 levels)"
    return f"is not JSON: {message}"


def _has_non_finite(value: Any) -> bool:
    """NaN and ±Infinity (stdlib ``json`` reads them; orjson writes ``null``)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is float:
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False
