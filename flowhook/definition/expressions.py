"""Expressions: Jinja2 in an immutable sandbox.

A string that is one whole ``{{ … }}`` evaluates to the expression's native value (a number
stays a number); any other string with ``{{`` or ``{%`` renders to text; the rest is kept as
is. Values nest: dicts and lists are templated item by item. Compiled once per flow version.
"""

from __future__ import annotations

import math
import operator
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from jinja2 import StrictUndefined, TemplateError, Undefined
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ExpressionError", "Renderer", "compile_value", "MAX_SEQUENCE"]

MAX_SEQUENCE = 100_000
"""Longest string or list an expression may build by repetition."""

_MAX_POWER_BITS = 4096

MAX_EVAL_SECONDS = 1.0
"""Longest one evaluation may run; a template looping for longer is stopped."""

Renderer = Callable[[dict[str, Any]], Any]


class ExpressionError(Exception):
    """An expression that does not compile, fails, or is refused by the sandbox."""


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        # JSON data first: payload.items is the payload's "items", not dict.items.
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            for seq, times in ((left, right), (right, left)):
                sized = isinstance(seq, str | list | tuple) and isinstance(times, int)
                if sized and len(seq) * times > MAX_SEQUENCE:
                    raise SecurityError(f"result longer than {MAX_SEQUENCE} items")
            return operator.mul(left, right)
        if operator_ == "**":
            ints = isinstance(left, int) and isinstance(right, int)
            if (
                ints
                and abs(left) > 1
                and right > 0
                and right * math.log2(abs(left)) > _MAX_POWER_BITS
            ):
                raise SecurityError("power too large")
            return operator.pow(left, right)
        return super().call_binop(context, operator_, left, right)


_env = _Sandbox(undefined=StrictUndefined, autoescape=False)
_TEMPLATE_FILE = "<template>"  # the file name Jinja gives code compiled from a string


class _TooSlow(Exception):
    pass


def _bounded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with a line tracer on template code that stops it after
    :data:`MAX_EVAL_SECONDS` (Python gives no other way to bound a loop in the sandbox)."""
    deadline = time.monotonic() + MAX_EVAL_SECONDS

    def local(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _TooSlow
        return local

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == _TEMPLATE_FILE else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.settrace(previous)


_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.DOTALL)


def _describe(exc: Exception) -> str:
    if isinstance(exc, _TooSlow):
        return f"took longer than {MAX_EVAL_SECONDS:g} s"
    if isinstance(exc, SecurityError):
        return f"refused by the sandbox: {exc}"
    return str(exc) or type(exc).__name__


def _compile_string(source: str) -> Renderer:
    whole = _WHOLE.match(source)
    if whole and "{{" not in whole["expr"] and "}}" not in whole["expr"]:
        try:
            expr = _env.compile_expression(whole["expr"], undefined_to_none=False)
        except TemplateError as exc:
            raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc

        def native(ctx: dict[str, Any]) -> Any:
            try:
                value = _bounded(expr, **ctx)
                if isinstance(value, Undefined):
                    value._fail_with_undefined_error()
                return value
            except Exception as exc:
                raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc

        return native
    if "{{" in source or "{%" in source:
        try:
            template = _env.from_string(source)
        except TemplateError as exc:
            raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc

        def text(ctx: dict[str, Any]) -> Any:
            try:
                return _bounded(template.render, ctx)
            except Exception as exc:
                raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc

        return text
    return lambda _ctx: source


def compile_value(value: Any) -> Renderer:
    """Compile a JSON value whose strings may hold expressions; raises ExpressionError."""
    if isinstance(value, str):
        return _compile_string(value)
    if isinstance(value, dict):
        parts = {k: compile_value(v) for k, v in value.items()}
        return lambda ctx: {k: r(ctx) for k, r in parts.items()}
    if isinstance(value, list):
        items = [compile_value(v) for v in value]
        return lambda ctx: [r(ctx) for r in items]
    return lambda _ctx: value
