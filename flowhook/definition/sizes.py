"""Bounds on the size of what a string operation makes, worked out before it runs: ``%`` and
``str.format`` (each field's width, precision and value), the growing methods of ``str``
(replace, pad, change case, expand tabs), a join, and JSON."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedFormatter

from flowhook.definition.budget import (
    MAX_SEQUENCE,
    charge,
    check_int,
    printed_size,
    room_left,
    sized,
    weight,
)

__all__ = [
    "MAX_WIDTH",
    "CASE",
    "GROWING_METHODS",
    "Formatter",
    "percent_size",
    "replace_size",
    "joined",
    "json_size",
    "nesting_depth",
]

MAX_WIDTH = 10_000
"""Largest width or precision a ``%`` or ``format`` spec may ask for."""

_FIXED_CHARS = 330
"""A bound on what one conversion prints beyond its value's weight (``'%f' % 1e308``)."""

_NUMERIC = frozenset("diufF")


def _spec_number(text: str, i: int, what: str) -> tuple[int, int]:
    """The number at ``text[i:]`` (a width or precision) and where it ends."""
    if i < len(text) and text[i] == "*":
        raise SecurityError(f"'*' {what}s are not available in expressions")
    j = i
    while j < len(text) and text[j].isdigit():
        j += 1
    number = int(text[i:j] or 0) if j - i <= 6 else MAX_WIDTH + 1
    if number > MAX_WIDTH:
        raise SecurityError(f"{what} {text[i:j]} is larger than {MAX_WIDTH}")
    return number, j


def _percent_specs(fmt: str) -> list[tuple[str | None, int, str]]:
    """The conversions of a ``%`` format, read as Python reads them: (mapping key, largest
    width or precision, conversion)."""
    specs: list[tuple[str | None, int, str]] = []
    i = fmt.find("%")
    while i >= 0:
        i += 1
        key = None
        if i < len(fmt) and fmt[i] == "(":
            depth, j = 1, i + 1
            while j < len(fmt) and depth:
                depth += {"(": 1, ")": -1}.get(fmt[j], 0)
                j += 1
            key, i = fmt[i + 1 : j - 1], j
        while i < len(fmt) and fmt[i] in "-+ #0":
            i += 1
        width, i = _spec_number(fmt, i, "width")
        precision = 0
        if i < len(fmt) and fmt[i] == ".":
            precision, i = _spec_number(fmt, i + 1, "precision")
        while i < len(fmt) and fmt[i] in "hlL":
            i += 1
        conversion = fmt[i] if i < len(fmt) else ""
        specs.append((key, max(width, precision), conversion))
        i = fmt.find("%", i + 1)
    return specs


def percent_size(fmt: str | bytes, args: Any) -> int:
    """A bound on the length of ``fmt % args``: the format, each conversion's padding and
    what it prints (a value named by a key as often as it is named; ``%r``/``%a`` as repr)."""
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    size = len(text)
    specs = _percent_specs(text)
    room = room_left()
    for key, pad, conversion in specs:
        size += pad + (_FIXED_CHARS if conversion in _NUMERIC else 0)
        if key is not None and isinstance(args, dict):
            value = args.get(key)
            times = 10 if conversion in "ra" else 1
            size += times * printed_size(value, room // times + 1)
        if size > room:
            return size
    if not isinstance(args, dict) or not any(key is not None for key, _, _ in specs):
        times = 10 if any(conversion in "ra" for _, _, conversion in specs) else 1
        values = args if isinstance(args, tuple) else (args,)
        size += times * sum(printed_size(v, room // times + 1) for v in values)
    return size


class Formatter(SandboxedFormatter):
    """str.format in the sandbox, each field's width and precision counted before it prints."""

    size = 0

    def _add(self, field: int, what: str) -> None:
        self.size += field
        charge(field if self.size <= MAX_SEQUENCE else self.size, what)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion in ("r", "a"):  # a repr: up to 10 characters for each one printed
            self._add(10 * printed_size(value, room_left() // 10 + 1), "format()")
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> Any:
        numbers = [int(n) if len(n) <= 6 else MAX_WIDTH + 1 for n in _DIGITS.findall(format_spec)]
        pad = max(numbers, default=0)
        if pad > MAX_WIDTH:
            raise SecurityError(f"width or precision {pad} is larger than {MAX_WIDTH}")
        number = isinstance(value, int | float) and not isinstance(value, bool)
        size = 2 * weight(value) + _FIXED_CHARS if number else printed_size(value)
        self._add(pad + size, "format()")
        return super().format_field(value, format_spec)


_DIGITS = re.compile(r"\d+")


def replace_size(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not sized(s) or not sized(old) or not sized(new):
        return 0
    if len(new) <= len(old):
        return len(s)
    hits = s.count(old) if len(old) else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return int(len(s) + hits * (len(new) - len(old)))


def _pad_size(s: Any, width: Any = 0, *_: Any) -> int:
    return max(len(s) if sized(s) else 0, check_int(width, "width"))


def _expandtabs_size(s: Any, tabsize: Any = 8) -> int:
    tabs = s.count("\t") if isinstance(s, str) else 0
    return len(s) + tabs * max(check_int(tabsize, "tab size"), 0)


def _case_size(s: Any, *_: Any) -> int:
    return CASE * len(s) if sized(s) else 0


CASE = 3
"""Unicode case mapping makes at most 3 characters of one (``'ΐ'.upper()``)."""

# Growing methods of str: name -> size of the result, given (self, *args).
GROWING_METHODS: dict[str, Callable[..., int]] = {
    "replace": replace_size,
    "ljust": _pad_size,
    "rjust": _pad_size,
    "center": _pad_size,
    "zfill": _pad_size,
    "expandtabs": _expandtabs_size,
    "upper": _case_size,
    "lower": _case_size,
    "title": _case_size,
    "capitalize": _case_size,
    "swapcase": _case_size,
    "casefold": _case_size,
}


def joined(sep: Any, items: Iterable[Any], what: str) -> tuple[list[Any], int]:
    """Materialise ``items`` (bounded) and the size of joining them with ``sep``."""
    parts: list[Any] = []
    size = 0
    step = len(sep) if sized(sep) else 0
    for item in items:
        parts.append(item)
        size += printed_size(item) + step
        if size > room_left():
            charge(size, what)
    return parts, size


def json_size(value: Any, limit: int) -> int:
    """A bound on the length of Jinja's ``tojson`` of ``value`` (without indent): HTML-safe
    escapes are 6 characters, a character outside the BMP 12; counting stops past ``limit``."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not (item.isascii() and item.isprintable()):
                total += _JSON_CHARS * len(item) + 2
            else:
                escaped = sum(item.count(c) for c in "<>&'")
                total += len(item) + 2 + 5 * escaped + item.count('"') + item.count("\\")
        elif isinstance(item, dict):
            total += 4 * len(item) + 2
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            total += 2 * len(item) + 2
            stack.extend(item)
        else:  # a number, true, false, null (anything else json refuses)
            total += weight(item, printed=True)
        if total > limit:
            return total
    return total


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply containers nest in ``value`` (looking at no more than ``limit`` of them)."""
    deepest = 0
    stack = [(value, 0)]
    while stack and limit > 0:
        item, depth = stack.pop()
        limit -= 1
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list | tuple):
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in item)
    return deepest if limit > 0 else max(deepest, room_left())


_JSON_CHARS = 12
"""What tojson prints for one character at most (a surrogate pair, ``\\ud83d\\ude00``)."""
