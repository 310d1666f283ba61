from __future__ import annotations

import pytest

from flowhook.definition import ExpressionError, compile_value

CTX = {"payload": {"n": 3, "items": [1, 2], "name": "Ada", "keys": "k"}, "steps": {}}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ payload.n }}", 3),
        ("{{ payload.n * 1.5 }}", 4.5),
        ("  {{ payload.items }}  ", [1, 2]),
        ("{{ payload.items | length }}", 2),
        ("{{ payload.keys }}", "k"),
        ("Hello {{ payload.name }}!", "Hello Ada!"),
        ("{{ payload.n }}{{ payload.n }}", "33"),
        ("plain", "plain"),
        ("{{ {'a': payload.n} }}", {"a": 3}),
        ("{{ payload.missing | default('none') }}", "none"),
        ("{% if payload.n > 2 %}big{% else %}small{% endif %}", "big"),
    ],
)
def test_values(source: str, expected: object) -> None:
    assert compile_value(source)(CTX) == expected


def test_nested_structures_are_templated_item_by_item() -> None:
    value = {"a": ["{{ payload.n }}", {"b": "x{{ payload.n }}"}], "c": 5, "d": None}
    assert compile_value(value)(CTX) == {"a": [3, {"b": "x3"}], "c": 5, "d": None}


@pytest.mark.parametrize(
    "source",
    [
        "{{ payload.nope }}",
        "{{ payload.nope.deeper }}",
        "{{ ''.__class__ }}",
        "{{ payload.__class__.__base__.__subclasses__() }}",
        "{{ lipsum.__globals__ }}",
        "{{ 'a' * 1000000 }}",
        "{{ [1] * 1000000 }}",
        "{{ 10 ** 100000 }}",
        "{{ range(1000000) | list }}",
        "{{ payload.items.append(3) }}",
    ],
)
def test_refused_or_failing_expressions_raise_expression_error(source: str) -> None:
    with pytest.raises(ExpressionError):
        compile_value(source)(CTX)


def test_syntax_errors_are_found_at_compile_time() -> None:
    with pytest.raises(ExpressionError):
        compile_value("{{ 1 + }}")
    with pytest.raises(ExpressionError):
        compile_value({"deep": ["{% if %}"]})


def test_a_runaway_loop_is_stopped() -> None:
    import time

    source = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(ExpressionError, match="longer than"):
        compile_value(source)(CTX)
    assert time.monotonic() - started < 5
