"""How a signal's data matches a ``wait`` step's ``match``: every field present and equal as
JSON, whatever the order of the fields, and nothing looser."""

from __future__ import annotations

from typing import Any

import pytest

from flowhook.store.signals import _projected, match_digest, match_keys


def matches(match: dict[str, Any], data: dict[str, Any]) -> bool:
    """As :func:`flowhook.store.signals.deliver` decides it."""
    projected = _projected(data, match_keys(match))
    return projected is not None and match_digest(projected) == match_digest(match)


@pytest.mark.parametrize(
    ("match", "data"),
    [
        ({"order_id": "o1"}, {"order_id": "o1"}),
        ({"order_id": "o1"}, {"order_id": "o1", "amount": 42}),  # extra fields do not matter
        ({"a": 1, "b": "x"}, {"b": "x", "a": 1}),  # nor their order
        ({"who": {"id": 7, "tags": ["a"]}}, {"who": {"tags": ["a"], "id": 7}}),  # nested
        ({"n": None}, {"n": None}),
        ({}, {"anything": True}),  # an empty match takes any signal of the name
        ({}, {}),
    ],
)
def test_matches(match: dict[str, Any], data: dict[str, Any]) -> None:
    assert matches(match, data)


@pytest.mark.parametrize(
    ("match", "data"),
    [
        ({"order_id": "o1"}, {"order_id": "o2"}),
        ({"order_id": "o1"}, {}),  # a missing field
        ({"order_id": "o1"}, {"order": "o1"}),
        ({"n": 1}, {"n": "1"}),  # JSON equality: a number is not its text
        ({"n": 1}, {"n": True}),  # nor a boolean
        ({"n": None}, {}),  # null is not absent
        ({"a": 1, "b": 2}, {"a": 1}),  # every field
        ({"l": [1, 2]}, {"l": [2, 1]}),  # lists in order
    ],
)
def test_does_not_match(match: dict[str, Any], data: dict[str, Any]) -> None:
    assert not matches(match, data)


def test_field_names_are_kept_as_a_sorted_json_list() -> None:
    assert match_keys({"b": 1, "a": 2, "x,y": 3}) == '["a","b","x,y"]'
    assert match_keys({}) == "[]"
