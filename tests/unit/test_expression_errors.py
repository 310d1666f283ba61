"""A failing expression says why in the flow author's words (issue 51): the value by its
path in what the expression read, its kind in JSON's words, and what to do; no Python type
names (``'dict object' has no attribute``, ``instances of 'str' and 'int'``)."""

from __future__ import annotations

import pytest

from flowhook.definition.explain import show_reads
from flowhook.definition.expressions import ExpressionError, compile_value, read_paths

CTX = {
    "payload": {"total": "5", "items": [{"sku": "a"}], "customer": {}, "n": None},
    "steps": {"price": {"output": {"amount": 3}}},
}


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("{{ payload.amount + 1 }}",
         "payload has no field 'amount' (its fields: customer, items, n, total)"),
        ("{{ payload.customer.email }}", "payload.customer has no field 'email' (it is empty)"),
        ("{{ payload.items[3].sku }}", "payload.items has no item 3 (it has 1)"),
        ("{{ payload.items[0].qty }}", "payload.items[0] has no field 'qty' (its fields: sku)"),
        ("{{ steps.tax.output }}", "no step 'tax' has run before this one (steps so far: price)"),
        ("{{ steps.price.output.cents }}",
         "steps.price.output has no field 'cents' (its fields: amount)"),
        ("{{ payload.total > 0 }}", "cannot compare text with a number (`>`)"),
        ("{{ payload.total + 1 }}", "cannot add a number to text"),
        ("{{ 1 - payload.total }}", "cannot use `-` on a number and text"),
        ("{{ payload.n + 1 }}", "cannot use `+` on null and a number"),
        ("{{ totl }}", "there is no 'totl' here; an expression here reads payload, steps"),
        ("{{ 10 / 0 }}", "division by zero"),
        ("total: {{ payload.totl }}", "payload has no field 'totl'"),
    ],
)  # fmt: skip
def test_a_failure_says_why_in_the_flow_s_words(source: str, said: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        compile_value(source)(CTX)
    message = str(caught.value)
    assert said in message, message
    assert not any(word in message for word in ("dict object", "instances of", "'str'", "'int'"))


def test_a_fix_is_suggested_where_it_is_clear() -> None:
    with pytest.raises(ExpressionError, match=r"payload\.x \| int"):
        compile_value("{{ payload.total >= 3 }}")(CTX)
    assert compile_value("{{ payload.total | int >= 3 }}")(CTX) is True


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("{{ payload.total | int > 9 }}", 'payload.total was "5"'),
        ("{{ payload.items[0].sku == 'b' and steps.price.output['amount'] > 5 }}",
         'payload.items[0].sku was "a", steps.price.output.amount was 3'),
        ("{{ payload.nope or payload.n }}", "payload.nope is missing, payload.n was null"),
        ("{{ payload.customer }}", ""),  # an object says little: its fields are what is read
        ("{{ payload.items | selectattr('sku') | list | length > 1 }}",
         'payload.items was [{"sku": "a"}]'),
        ("{% for i in payload.items %}{{ i.sku }}{% endfor %}", 'payload.items was [{"sku": "a"}]'),
        ("{{ payload.total ~ payload.total ~ payload.n ~ steps.price.output.amount }}",
         'payload.total was "5", payload.n was null, steps.price.output.amount was 3'),
    ],
)  # fmt: skip
def test_a_condition_shows_what_it_read(source: str, said: str) -> None:
    assert show_reads(read_paths(source), CTX) == said


def test_a_long_value_is_cut_short() -> None:
    shown = show_reads([("payload", "note")], {"payload": {"note": "x" * 500}})
    assert shown.startswith('payload.note was "xxx') and shown.endswith("…") and len(shown) < 90
