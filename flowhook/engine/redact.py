"""Keeping step secrets' values out of everything an attempt leaves behind.

An http step resolves the secrets it reads as it builds its request; each value (and the
forms it takes once JSON-escaped or URL-encoded) is then replaced by ``[secret:NAME]``
wherever it occurs, inside longer strings too, in the attempt's output, error and span
before the executor stores or emits any of them. A value is never logged.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

__all__ = ["Redactor", "marker"]


def marker(name: str) -> str:
    return f"[secret:{name}]"


def _forms(value: str) -> set[str]:
    """The value as it is, JSON-escaped (inside a body kept as text) and URL-encoded."""
    return {value, orjson.dumps(value).decode()[1:-1], quote(value, safe=""), quote(value)}


class Redactor:
    """Replaces each secret value it was given by its name's marker."""

    __slots__ = ("_pairs",)

    def __init__(self, values: dict[str, str]) -> None:
        pairs = {form: marker(name) for name, value in values.items() if value
                 for form in _forms(value) if form}  # fmt: skip
        # the longest first: a value that holds another is replaced whole
        self._pairs = sorted(pairs.items(), key=lambda p: -len(p[0]))

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def text(self, s: str) -> str:
        for value, shown in self._pairs:
            if value in s:
                s = s.replace(value, shown)
        return s

    def value(self, v: Any) -> Any:
        """``v`` with every string in it (keys too) redacted; a new value when one was."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {self.value(k): self.value(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        return v

    def in_place(self, attributes: dict[str, Any]) -> None:
        """A span's attributes, redacted where they are."""
        for key, v in list(attributes.items()):
            attributes[key] = self.value(v)
