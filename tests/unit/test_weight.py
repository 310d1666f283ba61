"""``sandbox.weight`` counts by exact type first (the plain values of a run's context) and
falls back to the isinstance chain for anything else: the same figure as the chain alone,
for every kind of value and both ways of counting."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.utils import Namespace

from flowhook.definition.budget import _FLOAT_CHARS, _OBJECT_CHARS, _SEQUENCES, weight


def reference(value: Any, limit: int, *, printed: bool = False) -> int:
    """The walk as it was written before the exact-type path."""
    if isinstance(value, str):
        return len(value)
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes):
            if not printed:
                total += len(item)
            elif isinstance(item, bytes):
                total += 4 * len(item) + 3
            elif item.isascii() and item.isprintable():
                total += 2 * len(item) + 3
            else:
                total += 10 * len(item) + 12
        elif isinstance(item, dict):
            total += len(item) * (4 if printed else 1)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, _SEQUENCES):
            total += len(item) * 4 + 2 if printed else len(item)
            stack.extend(item)
        elif isinstance(item, int):
            total += item.bit_length() // 3 + (printed and 5)
        elif isinstance(item, Namespace):
            stack.append(item._Namespace__attrs)
        elif printed:
            total += (
                _FLOAT_CHARS if isinstance(item, float) else 4 if item is None else _OBJECT_CHARS
            )
        if total > limit:
            return total
    return total


class Text(str):
    pass


leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
    st.text(max_size=20), st.binary(max_size=20), st.builds(Text, st.text(max_size=5)),
    st.just(range(3)), st.just(len),
)  # fmt: skip
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=5),
        st.dictionaries(st.text(max_size=5), inner, max_size=5).map(OrderedDict),
        st.dictionaries(st.text(max_size=5), inner, max_size=3).map(lambda d: Namespace(**d)),
        st.frozensets(st.integers(), max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=3).map(lambda d: d.values()),
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(values, st.integers(min_value=0, max_value=200), st.booleans())
def test_weight_is_the_isinstance_walks_figure(value: Any, limit: int, printed: bool) -> None:
    assert weight(value, limit, printed=printed) == reference(value, limit, printed=printed)
