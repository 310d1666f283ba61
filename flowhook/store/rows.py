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
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, Select, and_, select

__all__ = ["from_row", "from_values", "to_row", "owned", "page"]

T = TypeVar("T")

_NONE: Mapping[str, Callable[[Any], Any]] = {}


@cache
def _fields(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


_PLANS: dict[tuple[Any, tuple[Any, ...]], tuple[tuple[str, int], ...]] = {}
"""Per (model class, a result's column keys): which fields the row has, and at which index."""
_PLANS_MAX = 512
_LAST: dict[Any, tuple[Any, tuple[tuple[str, int], ...]]] = {}
"""Per model class: the result metadata last seen and its plan (the rows of one result, and
of every execution of a statement built once, share their metadata)."""


def _plan(cls: Any, row: Any) -> tuple[tuple[str, int], ...]:
    """The fields of ``cls`` that ``row`` has and each one's index in the row (``-1``: by
    name, for a name the row holds twice, which SQLAlchemy reports as ambiguous)."""
    parent = row._parent
    last = _LAST.get(cls)
    if last is not None and last[0] is parent:
        return last[1]
    key = (cls, tuple(parent.keys))
    plan = _PLANS.get(key)
    if plan is None:
        columns, index = row._mapping, row._key_to_index
        plan = tuple(
            (name, -1 if index.get(name) is None else index[name])
            for name in _fields(cls)
            if name in columns
        )
        if len(_PLANS) >= _PLANS_MAX:  # pragma: no cover - the store has a few dozen shapes
            _PLANS.clear()
        _PLANS[key] = plan
    _LAST[cls] = (parent, plan)
    return plan


def from_row(
    cls: type[T],
    row: Any,
    convert: Mapping[str, Callable[[Any], Any]] = _NONE,
    /,
    **given: Any,
) -> T:
    """``cls`` from ``row``: each field from the column of its name (through ``convert``'s
    function for it, if any), or from ``given``; a field the row lacks keeps its default.

    Which fields the row has, and where, is worked out once per class and result shape
    (:func:`_plan`), not looked up by name field by field: that was ~2 % of the engine's
    time under load."""
    values = given  # a fresh dict: the call's own keyword arguments
    for name, i in _plan(cls, row):
        if name in values:
            continue
        value = row[i] if i >= 0 else row._mapping[name]
        values[name] = convert[name](value) if name in convert else value
    return cls(**values)


@cache
def _positions(cls: Any, names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    fields = set(_fields(cls))
    return tuple((name, i) for i, name in enumerate(names) if name in fields)


def from_values(
    cls: type[T],
    names: tuple[str, ...],
    values: Sequence[Any],
    convert: Mapping[str, Callable[[Any], Any]] = _NONE,
    /,
) -> T:
    """:func:`from_row` for a plain tuple of ``values`` whose columns are ``names`` (a
    statement run on the driver, :func:`flowhook.store.bulk.run_pg`)."""
    found = {}
    for name, i in _positions(cast(Any, cls), names):
        value = values[i]
        found[name] = convert[name](value) if name in convert else value
    return cls(**found)


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
