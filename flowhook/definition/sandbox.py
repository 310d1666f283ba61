"""The expression sandbox: Jinja's immutable sandbox with every way to grow a value bounded.

Only listed methods (of str, int, float, dict, list, tuple, ...), filters and globals exist;
anything else of a built-in value is refused by name ("str.encode is not available in
expressions"). Each allowed operation that can build a string or list larger than its inputs
(``*``, ``%``, ``+``, ``~``, text output, and the filters and methods that print, escape,
change case, pad, repeat, replace, join or format) estimates the size of its result *before*
it runs, counting a value each time it is referenced, and is refused when that would pass
:data:`MAX_SEQUENCE`; the sizes an evaluation builds in all are bounded by
:data:`MAX_BUILT`. So no single library call runs long or allocates much, and the time bound
(checked between bytecodes, see ``deadline``) really bounds an evaluation. ``lipsum`` is gone."""

from __future__ import annotations

import math
import operator
import re
import threading
from collections.abc import Callable, Collection, Iterable
from types import BuiltinMethodType, MethodType
from typing import Any, NoReturn

from jinja2 import filters, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import Namespace, pass_environment, pass_eval_context

from flowhook.definition.explain import PlainUndefined

__all__ = [
    "INLINE_BUILT",
    "MAX_BUILT",
    "MAX_SEQUENCE",
    "SANDBOX",
    "NotInline",
    "start_budget",
    "weight",
]

MAX_SEQUENCE = 100_000
"""Longest string or list (characters or items) an expression may build."""

MAX_BUILT = 100 * MAX_SEQUENCE
"""Characters and items one evaluation may build in all, over every bounded operation."""

_MAX_INT_BITS = 4096

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


def _room() -> int:
    return min(MAX_SEQUENCE, _budget.left)


def _charge(size: int, what: str) -> None:
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
        limit = _room()
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
        # chain per item was a third of an evaluation in place)
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
_VIEWS: tuple[type[Collection[Any]], ...] = (type({}.keys()), type({}.values()), type({}.items()))
_SEQUENCES: tuple[type[Collection[Any]], ...] = (list, tuple, set, frozenset, *_VIEWS)
_FLOAT_CHARS = 24
"""The longest repr of a float (``-1.2345678901234567e-308``)."""
_OBJECT_CHARS = 100
"""A bound on the repr of any other value an expression can reach."""


def _printed(value: Any, limit: int | None = None) -> int:
    """A bound on ``len(str(value))``."""
    return weight(value, limit, printed=True)


def _total_weight(values: Iterable[Any], *, printed: bool = False) -> int:
    """The weights of ``values`` added up, stopping past what may still be built."""
    room = _room()
    total = 0
    for value in values:
        total += weight(value, room - total, printed=printed)
        if total > room:
            break
    return total


def _sized(value: Any) -> bool:
    return isinstance(value, str | bytes | list | tuple)


def _check_int(value: Any, what: str) -> int:
    if not isinstance(value, int):
        return 0
    if value > MAX_SEQUENCE:
        raise SecurityError(f"{what} {value} is larger than {MAX_SEQUENCE}")
    return value


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


def _percent_size(fmt: str | bytes, args: Any) -> int:
    """A bound on the length of ``fmt % args``: the format, each conversion's padding and
    what it prints (a value named by a key as often as it is named; ``%r``/``%a`` as repr)."""
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    size = len(text)
    specs = _percent_specs(text)
    room = _room()
    for key, pad, conversion in specs:
        size += pad + (_FIXED_CHARS if conversion in _NUMERIC else 0)
        if key is not None and isinstance(args, dict):
            value = args.get(key)
            times = 10 if conversion in "ra" else 1
            size += times * _printed(value, room // times + 1)
        if size > room:
            return size
    if not isinstance(args, dict) or not any(key is not None for key, _, _ in specs):
        times = 10 if any(conversion in "ra" for _, _, conversion in specs) else 1
        values = args if isinstance(args, tuple) else (args,)
        size += times * sum(_printed(v, room // times + 1) for v in values)
    return size


class _Formatter(SandboxedFormatter):
    """str.format in the sandbox, each field's width and precision counted before it prints."""

    size = 0

    def _add(self, field: int, what: str) -> None:
        self.size += field
        _charge(field if self.size <= MAX_SEQUENCE else self.size, what)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion in ("r", "a"):  # a repr: up to 10 characters for each one printed
            self._add(10 * _printed(value, _room() // 10 + 1), "format()")
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> Any:
        numbers = [int(n) if len(n) <= 6 else MAX_WIDTH + 1 for n in _DIGITS.findall(format_spec)]
        pad = max(numbers, default=0)
        if pad > MAX_WIDTH:
            raise SecurityError(f"width or precision {pad} is larger than {MAX_WIDTH}")
        number = isinstance(value, int | float) and not isinstance(value, bool)
        size = 2 * weight(value) + _FIXED_CHARS if number else _printed(value)
        self._add(pad + size, "format()")
        return super().format_field(value, format_spec)


_DIGITS = re.compile(r"\d+")


def _replace_size(s: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not _sized(s) or not _sized(old) or not _sized(new):
        return 0
    if len(new) <= len(old):
        return len(s)
    hits = s.count(old) if len(old) else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return int(len(s) + hits * (len(new) - len(old)))


def _pad_size(s: Any, width: Any = 0, *_: Any) -> int:
    return max(len(s) if _sized(s) else 0, _check_int(width, "width"))


def _expandtabs_size(s: Any, tabsize: Any = 8) -> int:
    tabs = s.count("\t") if isinstance(s, str) else 0
    return len(s) + tabs * max(_check_int(tabsize, "tab size"), 0)


def _case_size(s: Any, *_: Any) -> int:
    return _CASE * len(s) if _sized(s) else 0


_CASE = 3
"""Unicode case mapping makes at most 3 characters of one (``'ΐ'.upper()``)."""

# Growing methods of str: name -> size of the result, given (self, *args).
_METHODS: dict[str, Callable[..., int]] = {
    "replace": _replace_size,
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

_STR_METHODS = frozenset(
    [
        *_METHODS,
        "count",
        "endswith",
        "find",
        "format",
        "format_map",
        "index",
        "isalnum",
        "isalpha",
        "isascii",
        "isdecimal",
        "isdigit",
        "isidentifier",
        "islower",
        "isnumeric",
        "isprintable",
        "isspace",
        "istitle",
        "isupper",
        "join",
        "lstrip",
        "partition",
        "removeprefix",
        "removesuffix",
        "rfind",
        "rindex",
        "rpartition",
        "rsplit",
        "rstrip",
        "split",
        "splitlines",
        "startswith",
        "strip",
        "striptags",  # Markup's
        "unescape",  # Markup's
    ]
)
_NUMBER_METHODS = frozenset(["as_integer_ratio", "bit_count", "bit_length", "conjugate"])
_NUMBER_ATTRIBUTES = frozenset(["denominator", "imag", "numerator", "real"])
# The methods (and attributes) expressions may use, by the type they belong to; any other of
# these types' is refused. Not here: encode, hex, to_bytes, fromkeys, translate, ...
_ALLOWED: tuple[tuple[type | tuple[type, ...], frozenset[str]], ...] = (
    (str, _STR_METHODS),
    (int, _NUMBER_METHODS | _NUMBER_ATTRIBUTES),
    (float, _NUMBER_METHODS | _NUMBER_ATTRIBUTES | {"is_integer"}),
    (dict, frozenset(["copy", "get", "items", "keys", "values"])),
    (list, frozenset(["copy", "count", "index"])),
    ((tuple, range), frozenset(["count", "index", "start", "stop", "step"])),
    ((set, frozenset, *_VIEWS), frozenset(["isdisjoint"])),
    (bytes, frozenset()),
)


def _refuse_unlisted(obj: Any, name: str) -> None:
    """Refuse a method or attribute of a built-in value that is not on the list."""
    for kind, allowed in _ALLOWED:
        if isinstance(obj, kind):
            if name not in allowed and hasattr(obj, name):
                raise SecurityError(f"{type(obj).__name__}.{name} is not available in expressions")
            return


def _join(sep: Any, items: Iterable[Any], what: str) -> tuple[list[Any], int]:
    """Materialise ``items`` (bounded) and the size of joining them with ``sep``."""
    parts: list[Any] = []
    size = 0
    step = len(sep) if _sized(sep) else 0
    for item in items:
        parts.append(item)
        size += _printed(item) + step
        if size > _room():
            _charge(size, what)
    return parts, size


_MISSING = re.compile(r"No (filter|test) named (.+)\.")


class _Codegen(CodeGenerator):
    """``a ~ b`` and literal lists, tuples and dicts go through the sandbox: Jinja joins the
    parts in one C call, and ``[x, x]`` repeated would double a value's printed size each time
    (printing or comparing it then runs in C for ever)."""

    def fail(self, msg: str, lineno: int) -> NoReturn:
        missing = _MISSING.fullmatch(msg)
        if missing:  # a filter or test not on the list
            msg = f"the {missing[1]} {missing[2]} is not available in expressions"
        super().fail(msg, lineno)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.concat_values((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.literal(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.literal(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # a loop's or an assignment's targets
            super().visit_Tuple(node, frame)
            return
        self.write("environment.literal(")
        super().visit_Tuple(node, frame)
        self.write(")")


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+"})
    code_generator_class = _Codegen

    def getattr(self, obj: Any, attribute: str) -> Any:
        # JSON data first: payload.items is the payload's "items", not dict.items.
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        _refuse_unlisted(obj, attribute)
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        # The attr filter looks attributes up itself and asks here.
        try:
            _refuse_unlisted(obj, attr)
        except SecurityError:
            return False
        return bool(super().is_safe_attribute(obj, attr, value))

    def getitem(self, obj: Any, argument: Any) -> Any:
        # x['upper'] (and map(attribute='upper')) falls back to an attribute: the same list.
        if isinstance(argument, str) and not (isinstance(obj, dict) and argument in obj):
            _refuse_unlisted(obj, argument)
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            for seq, times in ((left, right), (right, left)):
                if _sized(seq) and isinstance(times, int) and times > 1:
                    _charge(weight(seq, _room() // times + 1) * times, "repetition")
            ints = isinstance(left, int) and isinstance(right, int)
            if ints and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise SecurityError("product too large")
            return operator.mul(left, right)
        if operator_ == "**":
            ints = isinstance(left, int) and isinstance(right, int)
            if (
                ints
                and abs(left) > 1
                and right > 0
                and right * math.log2(abs(left)) > _MAX_INT_BITS
            ):
                raise SecurityError("power too large")
            return operator.pow(left, right)
        if operator_ == "%" and isinstance(left, str | bytes):
            _charge(_percent_size(left, right), "formatted text")
            return operator.mod(left, right)
        if operator_ == "+" and _sized(left) and _sized(right):
            _charge(weight(left) + weight(right), "concatenation")
            return operator.add(left, right)
        return super().call_binop(context, operator_, left, right)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, BuiltinMethodType | MethodType):
            owner = getattr(obj, "__self__", None)
            name = obj.__name__
            _refuse_unlisted(owner, name)
            if isinstance(owner, str):
                if name in _METHODS:
                    _charge(_METHODS[name](owner, *args, **kwargs), f"{name}()")
                elif name == "join" and args:
                    parts, size = _join(owner, args[0], "join()")
                    _charge(size, "join()")
                    args = (parts, *args[1:])
        return super().call(context, obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # Jinja wraps str.format and format_map where they are looked up; ours bounds fields.
        owner = getattr(value, "__self__", None)
        if not isinstance(value, MethodType | BuiltinMethodType) or not isinstance(owner, str):
            return None
        if value.__name__ not in ("format", "format_map"):
            return None
        is_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs, args = args[0], ()
            return str(_Formatter(self).vformat(owner, args, kwargs))

        return wrapper

    @staticmethod
    def literal(value: Any) -> Any:
        _charge(weight(value), "literal")
        return value

    @staticmethod
    def concat_values(values: tuple[Any, ...]) -> str:
        _charge(_total_weight(values, printed=True), "concatenation")
        return "".join(map(str, values))

    @staticmethod
    def concat(parts: Iterable[Any]) -> str:
        # Jinja joins a template's output (and {% set %} blocks) with this.
        collected: list[str] = []
        size = 0
        for part in parts:
            size += len(part)
            if size > _room():
                _charge(size, "text output")
            collected.append(part)
        _charge(size, "text output")
        return "".join(collected)


def _finalize(value: Any) -> Any:
    # {{ value }} in text prints str(value) in one C call: bound what it would print.
    if not isinstance(value, str | int | float):
        _charge(_printed(value), "printed value")
    return value


def _json_size(value: Any, limit: int) -> int:
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


def _depth(value: Any, limit: int) -> int:
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
    return deepest if limit > 0 else max(deepest, _room())


_MAX_JSON_INDENT = 16
_MAX_ROUND_DIGITS = 1000
_MAX_LINK_ATTRIBUTE = 200
_JSON_CHARS = 12
"""What tojson prints for one character at most (a surrogate pair, ``\\ud83d\\ude00``)."""

# Filters that print their input (str(value)) and so make at most this many characters of
# each one it prints, plus their other arguments.
_PRINTING = {
    "string": 1,
    "safe": 1,
    "trim": 1,
    "striptags": 1,
    "wordcount": 1,
    "truncate": 1,
    "capitalize": _CASE,
    "lower": _CASE,
    "upper": _CASE,
    "title": _CASE,
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
            _charge(times * len(value), name)  # the usual case, kept cheap
            return fn(*args)
        room = _room()
        size = times * _printed(value, room // times + 1)
        if size <= room:
            size += _total_weight([*args[first + 1 :], *kwargs.values()], printed=True)
        _charge(size, name)
        return fn(*args, **kwargs)

    if takes_context:
        bounded.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
    return bounded


# -- the filters that can grow a value: each refuses a result past the cap before it runs


def _filter_replace(ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> Any:
    times = -1 if count is None else count
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        size = _replace_size(s, old, new, times)
    else:
        text = _printed(s)
        size = text + (text + 1) * _printed(new) if text <= _room() else text
    _charge(size, "replace")
    return filters.do_replace(ctx, s, old, new, count)


def _filter_center(value: Any, width: int = 80) -> str:
    _charge(max(_printed(value), _check_int(width, "width")), "center")
    return filters.do_center(value, width)


def _filter_indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    pad = len(width) if isinstance(width, str) else _check_int(width, "indent")
    if isinstance(s, str):
        size = len(s) + (s.count("\n") + 1) * pad
    else:
        text = _printed(s)
        size = text + (text + 1) * pad if text <= _room() else text
    _charge(size, "indent")
    return filters.do_indent(s, width, first, blank)


def _filter_wordwrap(env: Any, s: str, width: int = 79, *args: Any, **kwargs: Any) -> str:
    wrapstring = kwargs.get("wrapstring", args[1] if len(args) > 1 else None) or "\n"
    _charge(_printed(s) * (1 + _printed(wrapstring)), "wordwrap")
    return filters.do_wordwrap(env, s, width, *args, **kwargs)


def _filter_format(value: str, *args: Any, **kwargs: Any) -> str:
    if not isinstance(value, str):  # printed first: bound that too
        _charge(_printed(value), "format")
    _charge(_percent_size(str(value), kwargs or args), "format")
    return filters.do_format(value, *args, **kwargs)


def _filter_join(ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
    parts, size = _join(d, value, "join")
    _charge(size, "join")
    return filters.sync_do_join(ctx, parts, d, attribute)


def _filter_batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Any:
    # The last batch is filled with up to linecount - 1 references to fill_with.
    count = _check_int(linecount, "batch size")
    _charge(count * (weight(fill_with) + 1) if fill_with is not None else 0, "batch")
    return filters.do_batch(value, linecount, fill_with)


def _filter_slice(value: Collection[Any], slices: int, fill_with: Any = None) -> Any:
    count = _check_int(slices, "slice count")
    _charge(count * (weight(fill_with) + 1) if fill_with is not None else 0, "slice")
    return filters.sync_do_slice(value, slices, fill_with)


def _filter_sum(env: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
    items = list(iterable)
    if _sized(start) or any(_sized(i) for i in items):
        _charge(_total_weight([start, *items]), "sum")
    return filters.sync_do_sum(env, items, attribute, start)


def _filter_tojson(ctx: Any, value: Any, indent: Any = None) -> Any:
    # Each line of indented JSON starts with depth × indent spaces.
    if indent is not None and (not isinstance(indent, int) or not 0 <= indent <= _MAX_JSON_INDENT):
        raise SecurityError(f"tojson indent must be a number from 0 to {_MAX_JSON_INDENT}")
    room = _room()
    size = _json_size(value, room)
    if indent is not None and size <= room:  # a line for each item or closing bracket
        size += (size + 1) * (1 + _depth(value, size + 1) * indent)
    _charge(size, "tojson")
    return filters.do_tojson(ctx, value, indent)


def _filter_urlize(ctx: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    # Each word may become <a href="word" rel="…" target="…">word</a>, escaped.
    names = ["trim_url_limit", "nofollow", "target", "rel", "extra_schemes"]
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    extra = 0
    for name in ("target", "rel"):
        length = _printed(given.get(name))
        if length > _MAX_LINK_ATTRIBUTE:
            raise SecurityError(f"urlize {name} is longer than {_MAX_LINK_ATTRIBUTE}")
        extra += length
    text = _printed(value)
    words = len(value.split()) if isinstance(value, str) else text // 2 + 1
    _charge(12 * text + words * (100 + extra), "urlize")
    return filters.do_urlize(ctx, value, *args, **kwargs)


def _filter_round(value: float, precision: int = 0, method: str = "common") -> float:
    # round(5, -10**8) computes 10**(10**8) in one C call.
    if isinstance(precision, int) and abs(precision) > _MAX_ROUND_DIGITS:
        raise SecurityError(f"round precision {precision} is beyond ±{_MAX_ROUND_DIGITS}")
    return filters.do_round(value, precision, method)  # type: ignore[arg-type]


def _bounded_filters() -> dict[str, Callable[..., Any]]:
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


SANDBOX = _Sandbox(undefined=PlainUndefined, autoescape=False, finalize=_finalize)
# Only the listed filters exist (no pprint, ...), and of the globals no lipsum.
SANDBOX.filters = _bounded_filters()
SANDBOX.globals = {n: SANDBOX.globals[n] for n in ("range", "cycler", "joiner")}


def _checked(name: str, make: Callable[..., Any]) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        _charge(weight(args) + weight(kwargs), f"{name}()")
        return make(*args, **kwargs)

    return build


# dict(a=x, b=x) and namespace(a=x, b=x) build like literals do.
SANDBOX.globals["dict"] = _checked("dict", dict)
SANDBOX.globals["namespace"] = _checked("namespace", Namespace)
