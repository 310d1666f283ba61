"""Rows to typed objects and back: where a table's columns meet a model's fields.

A model's field and its column share a name, so one function maps any row to any of the
store's dataclasses (``from_row``: each field from the column of its name, through a
converter where the column holds a plainer value than the field, such as an enum's text),
and one gives the columns an insert writes (``to_row``: the named fields, enums as their
values). The models' ``from_row``/``to_row`` methods name only what differs. And one query
lists any resource a page at a time (:func:`page`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, and_, select

__all__ = ["from_row", "to_row", "owned", "page"]

T = TypeVar("T")

_NONE: Mapping[str, Callable[[Any], Any]] = {}


@cache
def _fields(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def from_row(
    cls: type[T],
    row: Any,
    convert: Mapping[str, Callable[[Any], Any]] = _NONE,
    /,
    **given: Any,
) -> T:
    """``cls`` from ``row``: each field from the column of its name (through ``convert``'s
    function for it, if any), or from ``given``; a field the row lacks keeps its default."""
    columns = row._mapping
    values = dict(given)
    for name in _fields(cls):  # type: ignore[arg-type]
        if name in values or name not in columns:
            continue
        value = columns[name]
        values[name] = convert[name](value) if name in convert else value
    return cls(**values)


def to_row(obj: Any, names: Iterable[str], /, **given: Any) -> dict[str, Any]:
    """The columns ``names`` from ``obj``'s fields of those names (enums as their values),
    then ``given``."""
    values = {}
    for name in names:
        value = getattr(obj, name)
        values[name] = value.value if isinstance(value, enum.Enum) else value
    values.update(given)
    return values


def owned(key: ColumnElement[str], value: str, workspace_id: str, mode: enum.Enum) -> Any:
    """The row whose ``key`` is ``value``, if ``workspace_id`` and ``mode`` own it (a key
    never sees another workspace's or mode's rows)."""
    table = key.table
    return and_(key == value, table.c.workspace_id == workspace_id, table.c.mode == mode.value)


def page(
    columns: Any,
    key: ColumnElement[str],
    workspace_id: str,
    mode: enum.Enum,
    *,
    limit: int,
    after: str | None,
    **equal: Any,
) -> Select[Any]:
    """A workspace and mode's rows, newest first by ``key`` (their time-ordered id), after
    the cursor ``after`` (the last id of the page before), where each column named in
    ``equal`` has the value given (``None``: any). ``columns``: a table or a column list."""
    table = key.table
    q = (
        (select(columns) if hasattr(columns, "c") else select(*columns))
        .where(table.c.workspace_id == workspace_id, table.c.mode == mode.value)
        .order_by(key.desc())
        .limit(limit)
    )
    if after is not None:
        q = q.where(key < after)
    for name, value in equal.items():
        if value is not None:
            q = q.where(table.c[name] == (value.value if isinstance(value, enum.Enum) else value))
    return q
