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
from collections.abc import Callable, Iterable
from types import BuiltinMethodType, MethodType
from typing import Any, NoReturn

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from flowhook.definition.bounded_filters import bounded_filters
from flowhook.definition.budget import (
    INLINE_BUILT,
    MAX_BUILT,
    MAX_SEQUENCE,
    VIEWS,
    NotInline,
    charge,
    printed_size,
    room_left,
    sized,
    start_budget,
    total_weight,
    weight,
)
from flowhook.definition.explain import PlainUndefined
from flowhook.definition.sizes import GROWING_METHODS, Formatter, joined, percent_size

__all__ = [
    "INLINE_BUILT",
    "MAX_BUILT",
    "MAX_SEQUENCE",
    "SANDBOX",
    "NotInline",
    "start_budget",
    "weight",
]

_MAX_INT_BITS = 4096

_STR_METHODS = frozenset(
    [
        *GROWING_METHODS,
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
    ((set, frozenset, *VIEWS), frozenset(["isdisjoint"])),
    (bytes, frozenset()),
)


def _refuse_unlisted(obj: Any, name: str) -> None:
    """Refuse a method or attribute of a built-in value that is not on the list."""
    for kind, allowed in _ALLOWED:
        if isinstance(obj, kind):
            if name not in allowed and hasattr(obj, name):
                raise SecurityError(f"{type(obj).__name__}.{name} is not available in expressions")
            return


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
                if sized(seq) and isinstance(times, int) and times > 1:
                    charge(weight(seq, room_left() // times + 1) * times, "repetition")
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
            charge(percent_size(left, right), "formatted text")
            return operator.mod(left, right)
        if operator_ == "+" and sized(left) and sized(right):
            charge(weight(left) + weight(right), "concatenation")
            return operator.add(left, right)
        return super().call_binop(context, operator_, left, right)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, BuiltinMethodType | MethodType):
            owner = getattr(obj, "__self__", None)
            name = obj.__name__
            _refuse_unlisted(owner, name)
            if isinstance(owner, str):
                if name in GROWING_METHODS:
                    charge(GROWING_METHODS[name](owner, *args, **kwargs), f"{name}()")
                elif name == "join" and args:
                    parts, size = joined(owner, args[0], "join()")
                    charge(size, "join()")
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
            return str(Formatter(self).vformat(owner, args, kwargs))

        return wrapper

    @staticmethod
    def literal(value: Any) -> Any:
        charge(weight(value), "literal")
        return value

    @staticmethod
    def concat_values(values: tuple[Any, ...]) -> str:
        charge(total_weight(values, printed=True), "concatenation")
        return "".join(map(str, values))

    @staticmethod
    def concat(parts: Iterable[Any]) -> str:
        # Jinja joins a template's output (and {% set %} blocks) with this.
        collected: list[str] = []
        size = 0
        for part in parts:
            size += len(part)
            if size > room_left():
                charge(size, "text output")
            collected.append(part)
        charge(size, "text output")
        return "".join(collected)


def _finalize(value: Any) -> Any:
    # {{ value }} in text prints str(value) in one C call: bound what it would print.
    if not isinstance(value, str | int | float):
        charge(printed_size(value), "printed value")
    return value


SANDBOX = _Sandbox(undefined=PlainUndefined, autoescape=False, finalize=_finalize)
# Only the listed filters exist (no pprint, ...), and of the globals no lipsum.
SANDBOX.filters = bounded_filters()
SANDBOX.globals = {n: SANDBOX.globals[n] for n in ("range", "cycler", "joiner")}


def _checked(name: str, make: Callable[..., Any]) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        charge(weight(args) + weight(kwargs), f"{name}()")
        return make(*args, **kwargs)

    return build


# dict(a=x, b=x) and namespace(a=x, b=x) build like literals do.
SANDBOX.globals["dict"] = _checked("dict", dict)
SANDBOX.globals["namespace"] = _checked("namespace", Namespace)
