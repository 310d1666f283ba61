"""The filters expressions have: each one that can grow a value refuses a result past the
cap (:mod:`flowhook.definition.budget`) before it runs; the others pass through."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from jinja2 import filters
from jinja2.exceptions import SecurityError
from jinja2.utils import pass_environment, pass_eval_context

from flowhook.definition.budget import (
    charge,
    check_int,
    printed_size,
    room_left,
    sized,
    total_weight,
    weight,
)
from flowhook.definition.sizes import (
    CASE,
    joined,
    json_size,
    nesting_depth,
    percent_size,
    replace_size,
)

__all__ = ["bounded_filters"]

_MAX_JSON_INDENT = 16
_MAX_ROUND_DIGITS = 1000
_MAX_LINK_ATTRIBUTE = 200

# Filters that print their input (str(value)) and so make at most this many characters of
# each one it prints, plus their other arguments.
_PRINTING = {
    "string": 1,
    "safe": 1,
    "trim": 1,
    "striptags": 1,
    "wordcount": 1,
    "truncate": 1,
    "capitalize": CASE,
    "lower": CASE,
    "upper": CASE,
    "title": CASE,
    "e": 6,
    "escape": 6,
    "forceescape": 6,
    "xmlattr": 6,
    "urlencode": 12,  # a 4-byte UTF-8 character is %XX%XX%XX%XX
}
# Filters whose result is made of references to their input, or a number: nothing to bound.
_PLAIN = [
    "abs",
    "attr",
    "count",
    "d",
    "default",
    "dictsort",
    "filesizeformat",
    "first",
    "float",
    "groupby",
    "int",
    "items",
    "last",
    "length",
    "list",
    "map",
    "max",
    "min",
    "random",
    "reject",
    "rejectattr",
    "reverse",
    "select",
    "selectattr",
    "sort",
    "unique",
]


def _printing(name: str, fn: Callable[..., Any], times: int) -> Callable[..., Any]:
    takes_context = hasattr(fn, "jinja_pass_arg")
    first = 1 if takes_context else 0

    def bounded(*args: Any, **kwargs: Any) -> Any:
        value = args[first]
        if isinstance(value, str) and len(args) == first + 1 and not kwargs:
            charge(times * len(value), name)  # the usual case, kept cheap
            return fn(*args)
        room = room_left()
        size = times * printed_size(value, room // times + 1)
        if size <= room:
            size += total_weight([*args[first + 1 :], *kwargs.values()], printed=True)
        charge(size, name)
        return fn(*args, **kwargs)

    if takes_context:
        bounded.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
    return bounded


# -- the filters that can grow a value: each refuses a result past the cap before it runs


def _filter_replace(ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> Any:
    times = -1 if count is None else count
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        size = replace_size(s, old, new, times)
    else:
        text = printed_size(s)
        size = text + (text + 1) * printed_size(new) if text <= room_left() else text
    charge(size, "replace")
    return filters.do_replace(ctx, s, old, new, count)


def _filter_center(value: Any, width: int = 80) -> str:
    charge(max(printed_size(value), check_int(width, "width")), "center")
    return filters.do_center(value, width)


def _filter_indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    pad = len(width) if isinstance(width, str) else check_int(width, "indent")
    if isinstance(s, str):
        size = len(s) + (s.count("\n") + 1) * pad
    else:
        text = printed_size(s)
        size = text + (text + 1) * pad if text <= room_left() else text
    charge(size, "indent")
    return filters.do_indent(s, width, first, blank)


def _filter_wordwrap(env: Any, s: str, width: int = 79, *args: Any, **kwargs: Any) -> str:
    wrapstring = kwargs.get("wrapstring", args[1] if len(args) > 1 else None) or "\n"
    charge(printed_size(s) * (1 + printed_size(wrapstring)), "wordwrap")
    return filters.do_wordwrap(env, s, width, *args, **kwargs)


def _filter_format(value: str, *args: Any, **kwargs: Any) -> str:
    if not isinstance(value, str):  # printed first: bound that too
        charge(printed_size(value), "format")
    charge(percent_size(str(value), kwargs or args), "format")
    return filters.do_format(value, *args, **kwargs)


def _filter_join(ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
    parts, size = joined(d, value, "join")
    charge(size, "join")
    return filters.sync_do_join(ctx, parts, d, attribute)


def _filter_batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Any:
    # The last batch is filled with up to linecount - 1 references to fill_with.
    count = check_int(linecount, "batch size")
    charge(count * (weight(fill_with) + 1) if fill_with is not None else 0, "batch")
    return filters.do_batch(value, linecount, fill_with)


def _filter_slice(value: Collection[Any], slices: int, fill_with: Any = None) -> Any:
    count = check_int(slices, "slice count")
    charge(count * (weight(fill_with) + 1) if fill_with is not None else 0, "slice")
    return filters.sync_do_slice(value, slices, fill_with)


def _filter_sum(env: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
    items = list(iterable)
    if sized(start) or any(sized(i) for i in items):
        charge(total_weight([start, *items]), "sum")
    return filters.sync_do_sum(env, items, attribute, start)


def _filter_tojson(ctx: Any, value: Any, indent: Any = None) -> Any:
    # Each line of indented JSON starts with depth × indent spaces.
    if indent is not None and (not isinstance(indent, int) or not 0 <= indent <= _MAX_JSON_INDENT):
        raise SecurityError(f"tojson indent must be a number from 0 to {_MAX_JSON_INDENT}")
    room = room_left()
    size = json_size(value, room)
    if indent is not None and size <= room:  # a line for each item or closing bracket
        size += (size + 1) * (1 + nesting_depth(value, size + 1) * indent)
    charge(size, "tojson")
    return filters.do_tojson(ctx, value, indent)


def _filter_urlize(ctx: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    # Each word may become <a href="word" rel="…" target="…">word</a>, escaped.
    names = ["trim_url_limit", "nofollow", "target", "rel", "extra_schemes"]
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    extra = 0
    for name in ("target", "rel"):
        length = printed_size(given.get(name))
        if length > _MAX_LINK_ATTRIBUTE:
            raise SecurityError(f"urlize {name} is longer than {_MAX_LINK_ATTRIBUTE}")
        extra += length
    text = printed_size(value)
    words = len(value.split()) if isinstance(value, str) else text // 2 + 1
    charge(12 * text + words * (100 + extra), "urlize")
    return filters.do_urlize(ctx, value, *args, **kwargs)


def _filter_round(value: float, precision: int = 0, method: str = "common") -> float:
    # round(5, -10**8) computes 10**(10**8) in one C call.
    if isinstance(precision, int) and abs(precision) > _MAX_ROUND_DIGITS:
        raise SecurityError(f"round precision {precision} is beyond ±{_MAX_ROUND_DIGITS}")
    return filters.do_round(value, precision, method)  # type: ignore[arg-type]


def bounded_filters() -> dict[str, Callable[..., Any]]:
    """The filters expressions have: each that can grow a value refuses a result past the
    cap before it runs."""
    bounded: dict[str, Callable[..., Any]] = {
        "round": _filter_round,
        "replace": pass_eval_context(_filter_replace),
        "center": _filter_center,
        "indent": _filter_indent,
        "wordwrap": pass_environment(_filter_wordwrap),
        "format": _filter_format,
        "join": pass_eval_context(_filter_join),
        "batch": _filter_batch,
        "slice": _filter_slice,
        "sum": pass_environment(_filter_sum),
        "tojson": pass_eval_context(_filter_tojson),
        "urlize": pass_eval_context(_filter_urlize),
    }
    bounded.update({n: _printing(n, filters.FILTERS[n], t) for n, t in _PRINTING.items()})
    bounded.update({n: filters.FILTERS[n] for n in _PLAIN})
    return bounded
