from __future__ import annotations

import copy
from typing import Any

import pytest

from flowhook.definition import validate_definition
from flowhook.errors import InvalidDefinition
from flowhook.service.bootstrap import EXAMPLE_FLOW

DESIGN_EXAMPLE: dict[str, Any] = {
    "name": "Process order",
    "timeout_seconds": 900,
    "steps": [
        {"id": "check", "type": "condition", "if": "{{ payload.amount > 0 }}", "else": "fail"},
        {"id": "price", "type": "transform", "output": {"total": "{{ payload.amount * 1.2 }}"}},
        {
            "id": "notify",
            "type": "http",
            "request": {
                "method": "POST",
                "url": "https://example.com/hook",
                "json": {
                    "order": "{{ payload.order_id }}",
                    "total": "{{ steps.price.output.total }}",
                },
            },
            "timeout_seconds": 10,
            "retry": {"max_attempts": 3},
        },
        {"id": "pause", "type": "delay", "seconds": 5},
    ],
    "output": {"order_id": "{{ payload.order_id }}"},
}


def test_design_example_and_bootstrap_example_are_valid() -> None:
    validate_definition(DESIGN_EXAMPLE)
    validate_definition(EXAMPLE_FLOW)


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (
            lambda d: d["steps"][1].pop("output"),
            "definition.steps[1].output",
            ["'price'", "required"],
        ),
        (
            lambda d: d["steps"][1].update(outptu=1),
            "definition.steps[1].outptu",
            ["'price'", "outptu"],
        ),
        (lambda d: d["steps"][0].update(type="nope"), "definition.steps[0].type", ["'check'"]),
        (lambda d: d.pop("name"), "definition.name", ["name"]),
        (
            lambda d: d["steps"][0].update({"else": "check"}),
            "definition.steps[0].else",
            ["later step"],
        ),
        (lambda d: d["steps"][3].update(id="check"), "definition.steps[3].id", ["already"]),
        (
            lambda d: d["steps"][2]["request"].pop("url"),
            "definition.steps[2].request.url",
            ["'notify'"],
        ),
        (
            lambda d: d["steps"][2].update(retry={"max_attempts": 0}),
            "definition.steps[2].retry.max_attempts",
            ["minimum"],
        ),
        (lambda d: d["steps"][1].update(id="has space"), "definition.steps[1].id", ["steps[1]"]),
        (lambda d: d.update(output={"x": "{{ ) }}"}), "definition.output", ["invalid expression"]),
    ],
)
def test_errors_name_the_step_and_field(mutate: Any, field: str, words: list[str]) -> None:
    definition = copy.deepcopy(DESIGN_EXAMPLE)
    mutate(definition)
    with pytest.raises(InvalidDefinition) as info:
        validate_definition(definition)
    assert info.value.field == field
    for word in words:
        assert word in info.value.message


@pytest.mark.parametrize(
    "bad", [None, [], "x", {"name": "x", "steps": []}, {"name": "", "steps": [{}]}]
)
def test_non_definitions_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidDefinition):
        validate_definition(bad)


@pytest.mark.parametrize(
    "expression",
    [
        "{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}",  # RecursionError in the compiler
        "{{ " + "9" * 4400 + " }}",  # ValueError: past Python's integer digit limit
        "{{ " + "[" * 500 + "]" * 500 + " }}",
    ],
)
def test_expressions_past_the_compilers_limits_are_invalid_not_a_crash(expression: str) -> None:
    flow = {"name": "x", "steps": [{"id": "a", "type": "transform", "output": {"v": expression}}]}
    with pytest.raises(InvalidDefinition, match=r"steps\[0\]\.output"):
        validate_definition(flow)
