"""The expression sandbox: Jinja's immutable sandbox with every way to grow a value bounded.

Each operation that can build a string or list larger than its inputs (``*``, ``%``, ``+``,
``~``, text output, and the filters and methods that pad, repeat, replace, join or format)
estimates the size of its result *before* it runs and is refused when that would pass
:data:`MAX_SEQUENCE`; the sizes an evaluation builds in all are bounded by
:data:`MAX_BUILT`. So no single library call runs long or allocates much, and the time bound
(checked between bytecodes, see ``deadline``) really bounds an evaluation. ``lipsum`` is gone.
"""

from __future__ import annotations

import math
import operator
import re
import threading
from collections.abc import Callable, Collection, Iterable
from types import BuiltinFunctionType, BuiltinMethodType, MethodType
from typing import Any

from jinja2 import StrictUndefined, filters, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import Namespace, pass_environment, pass_eval_context
from markupsafe import soft_str

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


def weight(value: Any, limit: int | None = None) -> int:
    """The size the cap counts: characters of a string, items of a list or dict plus the
    sizes of what they hold (a shared string counts each time it appears, as it would print
    or serialise); counting stops past ``limit`` (default: what the evaluation may still
    build), so a walk costs no more than what it guards."""
    if limit is None:
        limit = _room()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, dict):
            total += len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            total += len(item)
            stack.extend(item)
        elif isinstance(item, int):
            total += item.bit_length() // 3
        elif isinstance(item, Namespace):
            stack.append(item._Namespace__attrs)
        if total > limit:
            return total
    return total


def _total_weight(values: Iterable[Any]) -> int:
    """The weights of ``values`` added up, stopping past what may still be built."""
    room = _room()
    total = 0
    for value in values:
        total += weight(value, room - total)
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


# Format specs, for % and str.format: widths and precisions are the sizes they print.
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])")
_NUMBERS = re.compile(r"\d+")


def _percent_size(fmt: str | bytes, args: Any) -> int:
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    specs = _PERCENT.findall(text)
    if any("*" in (w, p) for w, p, _ in specs):
        raise SecurityError("'*' widths are not allowed in % formatting")
    pads = sum(max(int(w or 0), int(p or 0)) for w, p, _ in specs)
    return len(text) + pads + weight(args)


class _Formatter(SandboxedFormatter):
    """str.format in the sandbox, each field's width and precision counted before it prints."""

    size = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        pad = max((int(n) for n in _NUMBERS.findall(format_spec)), default=0)
        field = max(pad, weight(value))
        self.size += field
        _charge(field if self.size <= MAX_SEQUENCE else self.size, "format()")
        return super().format_field(value, format_spec)


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


# Growing methods of str, bytes and list: name -> size of the result, given (self, *args).
_METHODS: dict[str, Callable[..., int]] = {
    "replace": _replace_size,
    "ljust": _pad_size,
    "rjust": _pad_size,
    "center": _pad_size,
    "zfill": _pad_size,
    "expandtabs": _expandtabs_size,
}


def _join(sep: Any, items: Iterable[Any], what: str) -> tuple[list[Any], int]:
    """Materialise ``items`` (bounded) and the size of joining them with ``sep``."""
    parts: list[Any] = []
    size = 0
    step = len(sep) if _sized(sep) else 0
    for item in items:
        parts.append(item)
        size += weight(item) + step
        if size > _room():
            _charge(size, what)
    return parts, size


class _Codegen(CodeGenerator):
    """``a ~ b`` and literal lists, tuples and dicts go through the sandbox: Jinja joins the
    parts in one C call, and ``[x, x]`` repeated would double a value's printed size each time
    (printing or comparing it then runs in C for ever)."""

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
        return super().getattr(obj, attribute)

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
        if isinstance(obj, BuiltinMethodType | BuiltinFunctionType):
            owner = getattr(obj, "__self__", None)
            name = obj.__name__
            if isinstance(owner, str | bytes | list | tuple):
                if name in _METHODS:
                    _charge(_METHODS[name](owner, *args, **kwargs), f"{name}()")
                elif name == "join" and args:
                    parts, size = _join(owner, args[0], "join()")
                    _charge(size, "join()")
                    args = (parts, *args[1:])
                elif name == "translate":
                    raise SecurityError("translate() is not allowed")
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
        _charge(_total_weight(values), "concatenation")
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
        _charge(weight(value), "printed value")
    return value


def _bounded_filters() -> dict[str, Callable[..., Any]]:
    """The filters that can grow a value, each refusing a result past the cap first."""

    def replace(ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> Any:
        _charge(
            _replace_size(str(s), str(old), str(new), -1 if count is None else count), "replace"
        )
        return filters.do_replace(ctx, s, old, new, count)

    def center(value: Any, width: int = 80) -> str:
        _charge(_pad_size(str(value), width), "center")
        return filters.do_center(value, width)

    def indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
        pad = len(width) if isinstance(width, str) else _check_int(width, "indent")
        text = str(s)
        _charge(len(text) + (text.count("\n") + 1) * pad, "indent")
        return filters.do_indent(s, width, first, blank)

    def wordwrap(env: Any, s: str, width: int = 79, *args: Any, **kwargs: Any) -> str:
        wrapstring = kwargs.get("wrapstring", args[1] if len(args) > 1 else None) or "\n"
        _charge(len(s) * (1 + len(wrapstring)), "wordwrap")
        return filters.do_wordwrap(env, s, width, *args, **kwargs)

    def format_(value: str, *args: Any, **kwargs: Any) -> str:
        _charge(_percent_size(str(value), kwargs or args), "format")
        return filters.do_format(value, *args, **kwargs)

    def join(ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
        parts, size = _join(d, value, "join")
        _charge(size, "join")
        return filters.sync_do_join(ctx, parts, d, attribute)

    def batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Any:
        # The last batch is filled with up to linecount - 1 references to fill_with.
        count = _check_int(linecount, "batch size")
        _charge(count * (weight(fill_with) + 1) if fill_with is not None else 0, "batch")
        return filters.do_batch(value, linecount, fill_with)

    def slice_(value: Collection[Any], slices: int, fill_with: Any = None) -> Any:
        count = _check_int(slices, "slice count")
        _charge(count * (weight(fill_with) + 1) if fill_with is not None else 0, "slice")
        return filters.sync_do_slice(value, slices, fill_with)

    def sum_(env: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
        items = list(iterable)
        if _sized(start) or any(_sized(i) for i in items):
            _charge(_total_weight([start, *items]), "sum")
        return filters.sync_do_sum(env, items, attribute, start)

    def printed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        takes_context = hasattr(fn, "jinja_pass_arg")

        def bounded(*args: Any, **kwargs: Any) -> Any:
            _charge(weight(args[1] if takes_context else args[0]), name)
            return fn(*args, **kwargs)

        if takes_context:
            bounded.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
        return bounded

    return {
        "replace": pass_eval_context(replace),
        "center": center,
        "indent": indent,
        "wordwrap": pass_environment(wordwrap),
        "format": format_,
        "join": pass_eval_context(join),
        "batch": batch,
        "slice": slice_,
        "sum": pass_environment(sum_),
        "tojson": printed("tojson", filters.do_tojson),
        "string": printed("string", soft_str),
        "pprint": printed("pprint", filters.do_pprint),
        "urlencode": printed("urlencode", filters.do_urlencode),
    }


SANDBOX = _Sandbox(undefined=StrictUndefined, autoescape=False, finalize=_finalize)
SANDBOX.globals.pop("lipsum", None)
SANDBOX.filters.update(_bounded_filters())


def _checked(name: str, make: Callable[..., Any]) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        _charge(weight(args) + weight(kwargs), f"{name}()")
        return make(*args, **kwargs)

    return build


# dict(a=x, b=x) and namespace(a=x, b=x) build like literals do.
SANDBOX.globals["dict"] = _checked("dict", dict)
SANDBOX.globals["namespace"] = _checked("namespace", Namespace)
