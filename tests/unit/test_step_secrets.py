"""Which secrets an expression reads (by a literal name only), and the redaction of their
values wherever they occur."""

from __future__ import annotations

import pytest

from flowhook.definition import secret_names
from flowhook.definition.secret_refs import SecretUse
from flowhook.engine.redact import Redactor


def test_names_are_read_by_literal_name_only() -> None:
    assert secret_names({"h": "Bearer {{ secrets.STRIPE_KEY }}", "n": 1}) == {"STRIPE_KEY"}
    assert secret_names(["{{ secrets['A_1'] }}", "{{ payload.secrets }}"]) == {"A_1"}
    assert secret_names("no template: secrets.X") == set()
    for bad in ("{{ secrets }}", "{{ secrets[payload.k] }}", "{{ secrets.lower }}",
                "{% set secrets = 1 %}{{ secrets }}", "{{ secrets | list }}"):  # fmt: skip
        with pytest.raises(SecretUse):
            secret_names(bad)


def test_values_are_replaced_everywhere_longest_first() -> None:
    r = Redactor({"KEY": "abc123", "LONG": "abc123-and-more", "EMPTY": ""})
    assert r.text("x abc123-and-more y abc123") == "x [secret:LONG] y [secret:KEY]"
    got = r.value({"abc123": ["Bearer abc123", 5, None], "k": ("abc123",)})
    assert got == {"[secret:KEY]": ["Bearer [secret:KEY]", 5, None], "k": ["[secret:KEY]"]}


def test_escaped_and_encoded_forms_are_replaced() -> None:
    r = Redactor({"Q": 'p"w\\d/ x'})
    assert r.text('{"k": "p\\"w\\\\d/ x"}') == '{"k": "[secret:Q]"}'
    assert r.text("https://h/?k=p%22w%5Cd%2F%20x") == "https://h/?k=[secret:Q]"
