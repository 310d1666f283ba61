"""Expressions: Jinja2 in an immutable sandbox (see ``sandbox``), bounded in time (see
``deadline``).

A string that is one whole ``{{ … }}`` evaluates to the expression's native value (a number
stays a number); any other string with ``{{`` or ``{%`` renders to text; the rest is kept as
is. Values nest: dicts and lists are templated item by item. Compiled once per flow version.

An expression made only of lookups, operators, literals, conditions and a few linear filters
cannot run long (every operation in it is bounded by the size of its inputs), so it is
evaluated where it is asked for, at no extra cost. Any other (loops, calls, macros, other
filters) runs under the time bound, and :func:`evaluate` runs it in the process's
expression thread, so the event loop keeps serving while it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from jinja2 import TemplateError, Undefined, nodes
from jinja2.exceptions import SecurityError

from flowhook.definition.deadline import MAX_EVAL_SECONDS, TooSlow, bounded, in_thread
from flowhook.definition.sandbox import MAX_BUILT, MAX_SEQUENCE, SANDBOX, start_budget

__all__ = [
    "MAX_BUILT",
    "MAX_EVAL_SECONDS",
    "MAX_SEQUENCE",
    "ExpressionError",
    "Renderer",
    "compile_value",
    "evaluate",
]


class ExpressionError(Exception):
    """An expression that does not compile, fails, or is refused by the sandbox."""


_Fn = Callable[[dict[str, Any]], Any]


class Renderer:
    """A compiled value: call it with the context (in this thread), or ``await
    evaluate(renderer, ctx)`` (off the event loop when it could run long)."""

    __slots__ = ("_fn", "inline")

    def __init__(self, fn: _Fn, inline: bool) -> None:
        self._fn = fn
        self.inline = inline
        """Bounded by construction: cheap enough to evaluate on the event loop."""

    def __call__(self, ctx: dict[str, Any]) -> Any:
        start_budget()
        if self.inline:
            return self._fn(ctx)
        try:
            return bounded(self._fn, ctx)
        except TooSlow:
            raise ExpressionError(f"took longer than {MAX_EVAL_SECONDS:g} s") from None


async def evaluate(renderer: Renderer, ctx: dict[str, Any]) -> Any:
    """Evaluate ``renderer``; one that could run long runs in the expression thread."""
    if renderer.inline:
        return renderer(ctx)
    return await in_thread(renderer, ctx)


# What an expression may hold and still be evaluated inline: each of these costs at most
# time linear in its inputs (the operators that grow are bounded by the sandbox).
_INLINE_NODES = (
    nodes.Template,
    nodes.Output,
    nodes.TemplateData,
    nodes.Const,
    nodes.Name,
    nodes.Getattr,
    nodes.Getitem,
    nodes.Slice,
    nodes.BinExpr,
    nodes.UnaryExpr,
    nodes.Compare,
    nodes.Operand,
    nodes.CondExpr,
    nodes.List,
    nodes.Tuple,
    nodes.Dict,
    nodes.Pair,
    nodes.Keyword,
    nodes.Concat,
    nodes.If,
    nodes.Test,
)
_INLINE_FILTERS = frozenset(
    [
        "abs",
        "bool",
        "capitalize",
        "count",
        "d",
        "default",
        "e",
        "escape",
        "first",
        "float",
        "int",
        "items",
        "join",
        "last",
        "length",
        "list",
        "lower",
        "max",
        "min",
        "replace",
        "reverse",
        "round",
        "sort",
        "string",
        "sum",
        "title",
        "tojson",
        "trim",
        "unique",
        "upper",
    ]
)


def _inline(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Filter):
        if node.name not in _INLINE_FILTERS:
            return False
    elif not isinstance(node, _INLINE_NODES):
        return False
    return all(_inline(child) for child in node.iter_child_nodes())


_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.DOTALL)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SecurityError):
        return f"refused by the sandbox: {exc}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc) or type(exc).__name__


def _compile_string(source: str) -> tuple[_Fn, bool]:
    whole = _WHOLE.match(source)
    is_whole = bool(whole and "{{" not in whole["expr"] and "}}" not in whole["expr"])
    if not is_whole and "{{" not in source and "{%" not in source:
        return (lambda _ctx: source), True
    try:
        inline = _inline(SANDBOX.parse(source))
        if is_whole:
            assert whole is not None
            expr = SANDBOX.compile_expression(whole["expr"], undefined_to_none=False)
        else:
            template = SANDBOX.from_string(source)
    except TemplateError as exc:
        raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc

    if is_whole:

        def native(ctx: dict[str, Any]) -> Any:
            try:
                value = expr(**ctx)
                if isinstance(value, Undefined):
                    value._fail_with_undefined_error()
                return value
            except TooSlow:
                raise ExpressionError(
                    f"{source!r}: took longer than {MAX_EVAL_SECONDS:g} s"
                ) from None
            except Exception as exc:
                raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc

        return native, inline

    def text(ctx: dict[str, Any]) -> Any:
        try:
            return template.render(ctx)
        except TooSlow:
            raise ExpressionError(f"{source!r}: took longer than {MAX_EVAL_SECONDS:g} s") from None
        except Exception as exc:
            raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc

    return text, inline


def _compile(value: Any) -> tuple[_Fn, bool]:
    if isinstance(value, str):
        return _compile_string(value)
    if isinstance(value, dict):
        parts = {k: _compile(v) for k, v in value.items()}
        fns = {k: fn for k, (fn, _) in parts.items()}
        return (lambda ctx: {k: fn(ctx) for k, fn in fns.items()}), all(
            inline for _, inline in parts.values()
        )
    if isinstance(value, list):
        items = [_compile(v) for v in value]
        seq = [fn for fn, _ in items]
        return (lambda ctx: [fn(ctx) for fn in seq]), all(inline for _, inline in items)
    return (lambda _ctx: value), True


def compile_value(value: Any) -> Renderer:
    """Compile a JSON value whose strings may hold expressions; raises ExpressionError."""
    return Renderer(*_compile(value))
