"""What an expression may build, and what a value weighs against it.

Every bounded operation of the sandbox (:mod:`flowhook.definition.sandbox`) estimates the size
of its result before it runs and charges it here (:func:`charge`): one result may not pass
:data:`MAX_SEQUENCE`, and one evaluation may not build more than :data:`MAX_BUILT` in all
(:data:`INLINE_BUILT` when it runs in place, on the event loop). The budget is per thread."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.utils import Namespace

__all__ = [
    "MAX_SEQUENCE",
    "MAX_BUILT",
    "INLINE_BUILT",
    "NotInline",
    "start_budget",
    "room_left",
    "charge",
    "weight",
    "printed_size",
    "total_weight",
    "sized",
    "check_int",
    "VIEWS",
]

MAX_SEQUENCE = 100_000
"""Longest string or list (characters or items) an expression may build."""

MAX_BUILT = 100 * MAX_SEQUENCE
"""Characters and items one evaluation may build in all, over every bounded operation."""

INLINE_BUILT = 10_000
"""What an evaluation in place (on the event loop) may build before it is run again off it."""


class NotInline(BaseException):
    """An evaluation in place outgrew :data:`INLINE_BUILT`: evaluate it again off the loop
    (expressions have no side effects). A BaseException, so no ``except Exception`` in
    template or library code catches it."""


class _Budget(threading.local):
    left = MAX_BUILT
    inline = False


_budget = _Budget()


def start_budget(*, inline: bool) -> None:
    """Begin an evaluation in this thread: in place it may build :data:`INLINE_BUILT`,
    otherwise :data:`MAX_BUILT`."""
    _budget.left = INLINE_BUILT if inline else MAX_BUILT
    _budget.inline = inline


def room_left() -> int:
    return min(MAX_SEQUENCE, _budget.left)


def charge(size: int, what: str) -> None:
    if size > MAX_SEQUENCE:
        raise SecurityError(f"{what} would be longer than {MAX_SEQUENCE} characters or items")
    left = _budget.left - size
    if left < 0:
        if _budget.inline:
            raise NotInline
        raise SecurityError(f"the expression built more than {MAX_BUILT} characters or items")
    _budget.left = left


def weight(value: Any, limit: int | None = None, *, printed: bool = False) -> int:
    """The size the cap counts: characters of a string, items of a list or dict plus the
    sizes of what they hold (a shared string counts each time it appears, as it would print
    or serialise); counting stops past ``limit`` (default: what the evaluation may still
    build), so a walk costs no more than what it guards. ``printed``: bound ``str(value)``,
    where a string inside a container prints as its ``repr`` (up to 10 characters each)."""
    if limit is None:
        limit = room_left()
    if isinstance(value, str):
        return len(value)
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if printed:
            total += _item_weight(item, stack, printed=True)
        # the plain values of a run's context by their exact type first (an isinstance
        # chain per item is slow here: bench/README.md)
        elif kind is str or kind is bytes:
            total += len(item)
        elif kind is dict:
            total += len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            total += len(item)
            stack.extend(item)
        elif kind is int:
            total += item.bit_length() // 3
        elif item is None or kind is float or kind is bool:
            pass
        else:
            total += _item_weight(item, stack, printed=False)
        if total > limit:
            return total
    return total


def _item_weight(item: Any, stack: list[Any], *, printed: bool) -> int:
    """What ``item`` itself weighs in :func:`weight`; what it holds goes on ``stack``."""
    if isinstance(item, str | bytes):
        if not printed:
            return len(item)
        if isinstance(item, bytes):
            return 4 * len(item) + 3
        if item.isascii() and item.isprintable():
            return 2 * len(item) + 3
        return 10 * len(item) + 12
    if isinstance(item, dict):
        stack.extend(item.keys())
        stack.extend(item.values())
        return len(item) * (4 if printed else 1)
    if isinstance(item, _SEQUENCES):
        stack.extend(item)
        return len(item) * 4 + 2 if printed else len(item)
    if isinstance(item, int):
        return item.bit_length() // 3 + (printed and 5)
    if isinstance(item, Namespace):
        stack.append(item._Namespace__attrs)
        return 0
    if printed:  # as it prints: a float, None, a method, a range, ...
        return _FLOAT_CHARS if isinstance(item, float) else 4 if item is None else _OBJECT_CHARS
    return 0


# Concrete types (an isinstance against an ABC is slow, and weight runs on every evaluation).
VIEWS: tuple[type[Collection[Any]], ...] = (type({}.keys()), type({}.values()), type({}.items()))
_SEQUENCES: tuple[type[Collection[Any]], ...] = (list, tuple, set, frozenset, *VIEWS)
_FLOAT_CHARS = 24
"""The longest repr of a float (``-1.2345678901234567e-308``)."""
_OBJECT_CHARS = 100
"""A bound on the repr of any other value an expression can reach."""


def printed_size(value: Any, limit: int | None = None) -> int:
    """A bound on ``len(str(value))``."""
    return weight(value, limit, printed=True)


def total_weight(values: Iterable[Any], *, printed: bool = False) -> int:
    """The weights of ``values`` added up, stopping past what may still be built."""
    room = room_left()
    total = 0
    for value in values:
        total += weight(value, room - total, printed=printed)
        if total > room:
            break
    return total


def sized(value: Any) -> bool:
    return isinstance(value, str | bytes | list | tuple)


def check_int(value: Any, what: str) -> int:
    if not isinstance(value, int):
        return 0
    if value > MAX_SEQUENCE:
        raise SecurityError(f"{what} {value} is larger than {MAX_SEQUENCE}")
    return value
