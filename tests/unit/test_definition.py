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


def _with(step: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(DESIGN_EXAMPLE), "steps": [*DESIGN_EXAMPLE["steps"], step]}


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ("{{ steps.prize.output.total }}", "prize"),
        ("{{ steps['pricing'].output }}", "pricing"),
        ("total: {{ steps.price.output.total }} / {{ steps.tax.output }}", "tax"),
    ],
)
def test_a_literal_reference_to_a_step_the_flow_lacks_is_refused(
    expression: str, named: str
) -> None:
    step = {"id": "sum", "type": "transform", "output": {"v": expression}}
    with pytest.raises(InvalidDefinition) as exc:
        validate_definition(_with(step))
    assert exc.value.field == "definition.steps[4].output"
    assert f"steps.{named}, but the flow has no step {named!r}" in str(exc.value)


@pytest.mark.parametrize(
    "expression",
    [
        "{{ steps.price.output }}",
        "{{ steps[payload.which] }}",  # not literal: looked up when the step runs
        "{% set steps = {'x': 1} %}{{ steps.x }}",  # its own variable
        "{{ payload.steps.nothing }}",
    ],
)
def test_references_to_known_steps_or_not_literal_ones_pass(expression: str) -> None:
    validate_definition(_with({"id": "sum", "type": "transform", "output": {"v": expression}}))


def test_a_flow_step_s_fields_are_checked() -> None:
    good = {"id": "ship", "type": "flow", "flow_id": "wf_01jd7w2k3m4n5p6q7r8s9t0v1x"}
    validate_definition(_with({**good, "payload": {"o": "{{ payload.order_id }}"}, "wait": False}))
    for extra, field in [
        ({"flow_id": "wf_?"}, "definition.steps[4].flow_id"),
        ({"retry": {"max_attempts": 2}}, "definition.steps[4].retry"),
        ({"wait": "yes"}, "definition.steps[4].wait"),
        ({"payload": {"o": "{{ steps.nope }}"}}, "definition.steps[4].payload"),
    ]:
        with pytest.raises(InvalidDefinition) as exc:
            validate_definition(_with({**good, **extra}))
        assert exc.value.field == field, exc.value
        assert "step 'ship' (steps[4])" in str(exc.value)


NESTED: dict[str, Any] = {
    "name": "nested",
    "steps": [
        {"id": "start", "type": "transform", "output": {"v": 1}},
        {"id": "p", "type": "parallel", "branches": {
            "crm": [{"id": "crm_lookup", "type": "transform", "output": {"tier": "gold"}}],
            "billing": [{"id": "each", "type": "map", "items": [1, 2], "steps": [
                {"id": "charge", "type": "transform", "output": {"n": "{{ item }}"}}]}],
        }},
        {"id": "after", "type": "transform", "output": {"t": "{{ steps.crm_lookup.output }}"}},
    ],
}  # fmt: skip
_CRM = ("steps", 1, "branches", "crm", 0)
_CHARGE = ("steps", 1, "branches", "billing", 0, "steps", 0)


def _nested(at: tuple[Any, ...], change: Any) -> dict[str, Any]:
    """NESTED with ``change`` applied to the step at path ``at``."""
    definition = copy.deepcopy(NESTED)
    step = definition
    for part in at:
        step = step[part]
    change(step)
    return definition


@pytest.mark.parametrize(
    ("at", "change", "field", "words"),
    [
        # duplicate ids: a branch's step and a top-level one, a map's step and a branch's
        (_CRM, lambda s: s.update(id="start"), "definition.steps[1].branches.crm[0].id",
         ["step 'start' (steps[1].branches.crm[0])", "already used by steps[0]"]),
        (_CHARGE, lambda s: s.update(id="crm_lookup"),
         "definition.steps[1].branches.billing[0].steps[0].id",
         ["(steps[1].branches.billing[0].steps[0])", "already used by steps[1].branches.crm[0]"]),
        # schema errors name the nested step, not the parallel or map around it
        (_CRM, lambda s: s.pop("output"), "definition.steps[1].branches.crm[0].output",
         ["step 'crm_lookup' (steps[1].branches.crm[0])", "required"]),
        (_CRM, lambda s: s.update(outptu=1), "definition.steps[1].branches.crm[0].outptu",
         ["step 'crm_lookup' (steps[1].branches.crm[0])", "outptu"]),
        (_CHARGE, lambda s: s.update(retry={"max_attempts": 0}),
         "definition.steps[1].branches.billing[0].steps[0].retry.max_attempts",
         ["step 'charge' (steps[1].branches.billing[0].steps[0])"]),
        (("steps", 1, "branches", "billing", 0), lambda s: s.update(concurrency=0),
         "definition.steps[1].branches.billing[0].concurrency",
         ["step 'each' (steps[1].branches.billing[0])", "minimum"]),
        # a literal steps.<id> inside a branch to a step the flow lacks
        (_CRM, lambda s: s.update(output={"t": "{{ steps.crm_lookp.output }}"}),
         "definition.steps[1].branches.crm[0].output",
         ["step 'crm_lookup' (steps[1].branches.crm[0])", "steps.crm_lookp, but the flow has no "
          "step 'crm_lookp'"]),
        (_CHARGE, lambda s: s.update(output={"t": "{{ steps['nope'] }}"}),
         "definition.steps[1].branches.billing[0].steps[0].output", ["step 'nope'"]),
    ],
)  # fmt: skip
def test_errors_in_nested_steps_name_the_nested_step_and_field(
    at: tuple[Any, ...], change: Any, field: str, words: list[str]
) -> None:
    validate_definition(copy.deepcopy(NESTED))
    with pytest.raises(InvalidDefinition) as info:
        validate_definition(_nested(at, change))
    assert info.value.field == field, info.value.message
    for word in words:
        assert word in info.value.message, info.value.message


@pytest.mark.parametrize(
    ("definition", "field", "says"),
    [
        (
            {"name": "x", "steps": [{"id": "a", "type": "transform", "outptu": {}}]},
            "definition.steps[0].outptu",
            "unknown field 'outptu'; did you mean 'output'?",
        ),
        (
            {"name": "x", "steps": [{"id": "a", "type": "transfrom", "output": {}}]},
            "definition.steps[0].type",
            "'transfrom' is not one of transform, condition, fail, http, delay, python, wait, "
            "approval, parallel, map, flow, task; did you mean 'transform'?",
        ),
        (
            {
                "name": "x",
                "steps": [
                    {
                        "id": "a",
                        "type": "http",
                        "request": {"url": "https://a.example", "mehtod": "GET"},
                    }
                ],
            },
            "definition.steps[0].request.mehtod",
            "unknown field 'mehtod'; did you mean 'method'?",
        ),
        (
            {"name": "x", "stesp": []},
            "definition.stesp",
            "unknown field 'stesp'; did you mean 'steps'?",
        ),
        (
            {"name": "x", "steps": [{"id": "a", "type": "transform", "output": {}, "zzzz": 1}]},
            "definition.steps[0].zzzz",
            "unknown field 'zzzz'",
        ),
    ],
)
def test_a_typo_is_named_with_what_it_may_have_meant(
    definition: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(InvalidDefinition) as caught:
        validate_definition(definition)
    assert caught.value.field == field
    assert caught.value.message.endswith(f"{field} — {says}"), caught.value.message
    assert "[" not in caught.value.message.split(" — ")[1]  # no Python list in it


def test_every_problem_is_told_at_once_each_where_it_lies() -> None:
    """A definition with a problem in each of three steps is refused with all three, each
    naming its step and field; the message is the first's, and says how many more."""
    definition = {
        "name": "f",
        "steps": [
            {"id": "a", "type": "transfrom", "output": {}},
            {"id": "b", "type": "transform", "outptu": {}},
            {"id": "c", "type": "http"},
        ],
    }
    with pytest.raises(InvalidDefinition) as caught:
        validate_definition(definition)
    problems = caught.value.problems
    assert [p.field for p in problems] == [
        "definition.steps[0].type", "definition.steps[1].outptu", "definition.steps[2].request",
    ]  # fmt: skip
    assert "did you mean 'transform'" in problems[0].message
    assert "did you mean 'output'" in problems[1].message
    assert caught.value.message == f"{problems[0].message} (and 2 more problems)"
    assert caught.value.field == problems[0].field


def test_every_problem_past_the_schema_is_told_at_once() -> None:
    """Past the schema: a reused id, an expression that does not compile, a reference to a
    step the flow does not have and a bad jump, all told together."""
    definition = {
        "name": "f",
        "steps": [
            {"id": "a", "type": "transform", "output": {"x": "{{ payload.x + }}"}},
            {"id": "a", "type": "transform", "output": {"y": 1}},
            {"id": "b", "type": "transform", "output": {"z": "{{ steps.nope.output }}"}},
            {"id": "c", "type": "condition", "if": "{{ true }}", "then": "a"},
        ],
    }
    with pytest.raises(InvalidDefinition) as caught:
        validate_definition(definition)
    fields = [p.field for p in caught.value.problems]
    assert fields == [
        "definition.steps[1].id", "definition.steps[0].output", "definition.steps[2].output",
        "definition.steps[3].then",
    ], [p.message for p in caught.value.problems]  # fmt: skip


def test_one_problem_is_told_as_before() -> None:
    with pytest.raises(InvalidDefinition) as caught:
        validate_definition({"name": "f", "steps": [{"id": "a", "type": "transform"}]})
    assert len(caught.value.problems) == 1
    assert "more problem" not in caught.value.message
