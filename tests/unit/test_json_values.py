"""JSON the store cannot write back is refused up front, naming the field and the reason."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from flowhook.errors import InvalidInput
from flowhook.service.jsonvalues import encode_json


def deep(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"n": 10**30}, "64-bit"),
        ({"n": [-(2**64)]}, "64-bit"),
        (deep(300), "nested too deeply"),
        ({"x": float("nan")}, "NaN or Infinity"),
        ({"x": [1, {"y": float("-inf")}]}, "NaN or Infinity"),
        ({"x": "a\x00b"}, "NUL"),
        ({"k\x00": 1}, "NUL"),
    ],
)
def test_refused_with_the_reason(value: Any, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        encode_json(value, "payload")
    assert caught.value.message.startswith("payload ") and words in caught.value.message
    assert caught.value.field == "payload"


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"n": 2**63 - 1, "m": -(2**63), "u": 2**64 - 1, "f": 1.5, "z": None},
        {"text": "a literal \\u0000 is text", "more": "\\\\u0000"},
        deep(200),
        {"unicode": "é ☃ 𝄞"},
    ],
)
def test_kept_byte_for_byte(value: Any) -> None:
    encoded = encode_json(value, "payload")
    assert orjson.dumps(encoded) == orjson.dumps(value)
    assert json.loads(orjson.dumps(encoded)) == value
