"""Why an expression failed, in the words of the flow's author.

Jinja and Python say what failed in their own terms: ``'dict object' has no attribute
'amount'``, ``'>' not supported between instances of 'str' and 'int'``. A flow's author
thinks in the JSON their flow reads, so a failure names the value by its path in the context
(``payload has no field 'amount'``), its kind in JSON's words (text, a number, an object),
and what to do when that is clear (``payload.total | int``).

A read of something missing raises :class:`Missing` (the sandbox's undefined values are
:class:`PlainUndefined`), which keeps the object read and the name asked for; the object's
path is found when the error is explained, in the context the expression read (a search by
identity, bounded, paid only by a failure)."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Sequence
from typing import Any

from jinja2 import StrictUndefined, Undefined
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.utils import missing

__all__ = ["Missing", "PlainUndefined", "explain", "kind", "show_reads"]

SEARCHED = 5000
"""At most this many values are looked at to find a missing field's owner by its path."""


class Missing(UndefinedError):
    """An expression read a name, field or item that is not there."""

    def __init__(self, message: str, owner: Any, name: Any) -> None:
        super().__init__(message)
        self.owner = owner
        """What was read from (Jinja's ``missing`` for a name of the context)."""
        self.name = name


class PlainUndefined(StrictUndefined):
    """:class:`~jinja2.StrictUndefined` whose failure keeps what was read (:class:`Missing`)."""

    __slots__ = ()

    def _fail_with_undefined_error(self, *args: Any, **kwargs: Any) -> Any:
        raise Missing(self._undefined_message, self._undefined_obj, self._undefined_name)


# StrictUndefined binds its operators to Undefined's own method when the class is made: bind
# each of them to the one above.
for _cls in StrictUndefined.__mro__:
    for _name, _value in vars(_cls).items():
        if _value is Undefined._fail_with_undefined_error and _name != "_fail_with_undefined_error":
            setattr(PlainUndefined, _name, PlainUndefined._fail_with_undefined_error)

_KINDS = {
    str: "text",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
    dict: "an object",
    list: "a list",
    tuple: "a list",
}
_PY_KINDS = {
    "str": "text", "int": "a number", "float": "a number", "bool": "true or false",
    "NoneType": "null", "dict": "an object", "list": "a list", "tuple": "a list",
}  # fmt: skip


def kind(value: Any) -> str:
    """A value's kind in JSON's words: text, a number, an object…"""
    if isinstance(value, Undefined):
        return "nothing"
    return _KINDS.get(type(value), type(value).__name__)


_COMPARE = re.compile(
    r"'(?P<op>[<>=!]+)' not supported between instances of '(?P<a>\w+)' and '(?P<b>\w+)'"
)
_OPERAND = re.compile(
    r"unsupported operand type\(s\) for (?P<op>\S+?): '(?P<a>\w+)' and '(?P<b>\w+)'"
)
_CONCAT = re.compile(r'can only concatenate (?P<a>\w+) \(not "(?P<b>\w+)"\) to \w+')
_ADVICE = "convert one of them first, as in `payload.x | int`, `| float` or `| string`"


def explain(exc: BaseException, ctx: dict[str, Any] | None = None) -> str:
    """``exc``, raised by an expression evaluated in ``ctx``, in the words of the flow's
    author."""
    if isinstance(exc, Missing):
        return _missing(exc, ctx or {})
    if isinstance(exc, SecurityError):
        return f"refused by the sandbox: {exc}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, ZeroDivisionError):
        return "division by zero"
    said = str(exc)
    if isinstance(exc, TypeError):
        if m := _COMPARE.fullmatch(said):
            a, b = _PY_KINDS.get(m["a"], m["a"]), _PY_KINDS.get(m["b"], m["b"])
            return f"cannot compare {a} with {b} (`{m['op']}`): {_ADVICE}"
        if m := _OPERAND.fullmatch(said):
            a, b = _PY_KINDS.get(m["a"], m["a"]), _PY_KINDS.get(m["b"], m["b"])
            return f"cannot use `{m['op']}` on {a} and {b}: {_ADVICE}"
        if m := _CONCAT.fullmatch(said):
            b = _PY_KINDS.get(m["b"], m["b"])
            return f"cannot add {b} to text: {_ADVICE}"
    return said or type(exc).__name__


def _missing(exc: Missing, ctx: dict[str, Any]) -> str:
    name, owner = exc.name, exc.owner
    if owner is missing:
        known = ", ".join(sorted(ctx)) or "nothing"
        return f"there is no {name!r} here; an expression here reads {known}"
    path = _path_of(owner, ctx)
    where = path or f"the value ({kind(owner)})"
    if isinstance(owner, dict):
        fields = sorted(str(k) for k in owner)
        has = f" (its fields: {', '.join(fields[:8])}{', …' if len(fields) > 8 else ''})"
        if path == "steps":
            ran = f" (steps so far: {', '.join(fields)})" if fields else ""
            return f"no step {name!r} has run before this one{ran}"
        return f"{where} has no field {name!r}" + (has if fields else " (it is empty)")
    if isinstance(owner, list | tuple) and isinstance(name, int):
        return f"{where} has no item {name} (it has {len(owner)})"
    return f"{where} is {kind(owner)}, which has no field {name!r}"


def _path_of(target: Any, ctx: dict[str, Any]) -> str | None:
    """Where ``target`` is in ``ctx`` (``payload.customer``, ``steps.price.output``,
    ``payload.items[2]``): the shortest path, by identity; ``None`` when not found."""
    queue: deque[tuple[Any, str]] = deque((value, key) for key, value in ctx.items())
    seen = 0
    while queue and seen < SEARCHED:
        value, path = queue.popleft()
        seen += 1
        if value is target:
            return path
        if isinstance(value, dict):
            for key, item in value.items():
                step = f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
                queue.append((item, path + step))
        elif isinstance(value, list | tuple):
            queue.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
    return None


SHOWN_READS = 3
"""At most this many values are shown of what a failed condition read."""
SHOWN_CHARS = 60
"""A value shown longer than this is cut (with …)."""


def show_reads(paths: Sequence[tuple[str | int, ...]], ctx: dict[str, Any]) -> str:
    """What an expression read, for its failure's message: ``payload.amount was -3,
    payload.currency was "EUR"`` (JSON values, cut short; a read of nothing says so); the
    paths whose first name is not in ``ctx`` (a loop's own variable) are left out."""
    shown: list[str] = []
    for path in paths:
        if path[0] not in ctx:
            continue
        value: Any = ctx[path[0]]
        name = str(path[0])
        for key in path[1:]:
            name += f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
            if _has(value, key):
                value = value[key]
            else:
                value = missing
                break
        if value is missing:
            shown.append(f"{name} is missing")
        elif not isinstance(value, dict):  # a whole object says little; its fields are read
            text = json.dumps(value, ensure_ascii=False, default=str)
            cut = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
            shown.append(f"{name} was {cut}")
        if len(shown) == SHOWN_READS:
            break
    return ", ".join(shown)


def _has(value: Any, key: str | int) -> bool:
    if isinstance(value, dict):
        return key in value
    return isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value)
