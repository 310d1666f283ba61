"""``{{ secrets.NAME }}``: which step secrets a value's expressions read.

Only an ``http`` step's ``request`` ``url``, ``headers`` and body (``json``, ``body``) may
read them (:data:`SECRET_FIELDS`): every other field is stored as it is evaluated (a task's
input, a transform's output) or shown (a query string in a span). A secret is read by a
literal name only (``secrets.STRIPE_KEY`` or ``secrets['STRIPE_KEY']``), so the names a flow
needs are known when it is saved, and an unknown one refused then.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2 import TemplateError, nodes

from flowhook.definition.expressions import strings_in
from flowhook.definition.sandbox import SANDBOX

__all__ = ["SECRET_NAME", "SECRET_FIELDS", "SecretUse", "secret_names", "is_secret_name"]

SECRET_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""A step secret's name: upper case, digits and ``_``, a letter first, at most 64."""

SECRET_FIELDS = ("url", "headers", "json", "body")
"""The fields of an http step's ``request`` that may read secrets."""


class SecretUse(ValueError):
    """``secrets`` used otherwise than by a literal, well-formed name."""


def is_secret_name(name: str) -> bool:
    return SECRET_NAME.fullmatch(name) is not None


def secret_names(value: Any) -> set[str]:
    """The secrets a JSON value's expressions read by name; raises :class:`SecretUse` for
    ``secrets`` read whole, by a computed key, or assigned. Strings that do not compile are
    skipped (their own check says so)."""
    found: set[str] = set()
    for source in strings_in(value):
        if "secrets" not in source or ("{{" not in source and "{%" not in source):
            continue
        try:
            tree = SANDBOX.parse(source)
        except TemplateError:
            continue
        found |= _names_in(tree)
    return found


def _names_in(tree: nodes.Node) -> set[str]:
    found: set[str] = set()
    named: set[int] = set()  # the ``secrets`` Name nodes read through a literal key
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        assert isinstance(node, nodes.Getattr | nodes.Getitem)
        base = node.node
        if not (isinstance(base, nodes.Name) and base.name == "secrets"):
            continue
        if isinstance(node, nodes.Getattr):
            key: Any = node.attr
        else:
            key = node.arg.value if isinstance(node.arg, nodes.Const) else None
        if not isinstance(key, str) or not is_secret_name(key):
            raise SecretUse(
                f"secrets must be read by a literal name such as secrets.STRIPE_KEY "
                f"({SECRET_NAME.pattern}), not {key!r}"
                if isinstance(key, str)
                else "secrets must be read by a literal name such as secrets.STRIPE_KEY"
            )
        found.add(key)
        named.add(id(base))
    for name in tree.find_all(nodes.Name):
        if name.name == "secrets" and id(name) not in named:
            raise SecretUse(
                "secrets may only be read one by a literal name (secrets.STRIPE_KEY), not "
                "whole or assigned"
            )
    return found
