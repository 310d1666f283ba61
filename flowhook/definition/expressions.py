"""Expressions: Jinja2 in an immutable sandbox (see ``sandbox``), bounded in time (see
``deadline``).

A string that is one whole ``{{ … }}`` evaluates to the expression's native value (a number
stays a number); any other string with ``{{`` or ``{%`` renders to text; the rest is kept as
is. Values nest: dicts and lists are templated item by item. Compiled once per flow version.

Where it runs: an evaluation that is cheap for sure is done in place, with no thread hop and
no timer; that is one whose expressions are small (:data:`MAX_INLINE_NODES`) and made only of
lookups, operators, literals, conditions and constant-time filters, over a small context
(:data:`SMALL_CONTEXT`), building little (``sandbox.INLINE_BUILT``; past it, it is dropped
and evaluated again off the loop: expressions have no side effects). Its worst case is then
a few tens of milliseconds, its usual one microseconds. Every other evaluation runs under
the time bound in the process's expression thread (:func:`evaluate`), so the event loop
keeps serving while it runs.

Compiling is bounded too: Jinja's compile time grows with an expression's length and faster
than linearly with its nesting (a chain of 150 ``+`` took 0.6 s), so one expression may be at
most :data:`MAX_EXPRESSION_CHARS` long and :data:`MAX_EXPRESSION_DEPTH` deep when a flow is
saved (:func:`check_size`). A string is
compiled once per process (:func:`compile_value` remembers the last
:data:`COMPILED_CACHE` of them), so saving a flow and running it compile it once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from jinja2 import TemplateError, Undefined, nodes

from flowhook.definition import deadline
from flowhook.definition.deadline import MAX_EVAL_SECONDS, TooSlow, bounded, in_thread
from flowhook.definition.explain import explain
from flowhook.definition.sandbox import (
    MAX_BUILT,
    MAX_SEQUENCE,
    SANDBOX,
    NotInline,
    start_budget,
    weight,
)

__all__ = [
    "MAX_EXPRESSION_CHARS",
    "strings_in",
    "MAX_EXPRESSION_DEPTH",
    "MAX_BUILT",
    "MAX_EVAL_SECONDS",
    "MAX_SEQUENCE",
    "ExpressionError",
    "Renderer",
    "check_size",
    "compile_value",
    "evaluate",
    "expression_chars",
    "read_paths",
    "referenced_steps",
]


class ExpressionError(Exception):
    """An expression that does not compile, fails, or is refused by the sandbox."""


_Fn = Callable[[dict[str, Any]], Any]


class Renderer:
    """A compiled value: call it with the context (in this thread), or ``await
    evaluate(renderer, ctx)`` (off the event loop when it could run long)."""

    __slots__ = ("_fn", "_names", "inline")

    def __init__(self, fn: _Fn, inline: bool, names: frozenset[str] = frozenset()) -> None:
        self._fn = fn
        self.inline = inline
        """Bounded by construction: cheap enough to evaluate on the event loop."""
        self._names = names
        """The context's names its expressions use: all they can read of it."""

    def __call__(self, ctx: dict[str, Any]) -> Any:
        try:
            return self.in_place(ctx)
        except NotInline:
            return self.bounded(ctx)

    def in_place(self, ctx: dict[str, Any]) -> Any:
        """Evaluate here when that is cheap for sure; raises NotInline when it is not."""
        if not self.inline:
            raise NotInline
        # only what its names reach counts: a map item's expressions that read ``item`` stay
        # in place however large the run's payload
        read = [ctx[name] for name in self._names if name in ctx]
        if weight(read, SMALL_CONTEXT) > SMALL_CONTEXT:
            raise NotInline
        start_budget(inline=True)
        return self._fn(ctx)

    def bounded(self, ctx: dict[str, Any], seconds: float | None = None) -> Any:
        """Evaluate in this thread, stopped after ``seconds`` (default
        :data:`MAX_EVAL_SECONDS`)."""
        start_budget(inline=False)
        try:
            return bounded(self._fn, ctx, seconds=seconds)
        except TooSlow:
            raise ExpressionError(_too_slow(seconds)) from None


async def evaluate(renderer: Renderer, ctx: dict[str, Any], *, seconds: float | None = None) -> Any:
    """Evaluate ``renderer``: in place when that is cheap for sure, otherwise in the
    expression thread, the event loop free meanwhile, stopped after ``seconds``."""
    try:
        return renderer.in_place(ctx)
    except NotInline:
        return await in_thread(renderer.bounded, ctx, seconds)


MAX_INLINE_NODES = 64
"""Largest expression (syntax nodes, over a whole compiled value) evaluated in place."""

SMALL_CONTEXT = 4096
"""Largest context (as :func:`sandbox.weight` counts) an evaluation in place may read."""

# What an expression may hold and still be evaluated in place: each costs time at most
# linear in its (small) inputs, with no Python-level loop over them.
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
        "last",
        "length",
        "lower",
        "round",
        "string",
        "title",
        "trim",
        "upper",
    ]
)
_NOT_INLINE = MAX_INLINE_NODES + 1


def _inline_size(node: nodes.Node) -> int:
    """The nodes of ``node``, or more than :data:`MAX_INLINE_NODES` when it may not run in
    place."""
    if isinstance(node, nodes.Filter):
        if node.name not in _INLINE_FILTERS:
            return _NOT_INLINE
    elif not isinstance(node, _INLINE_NODES):
        return _NOT_INLINE
    size = 1
    for child in node.iter_child_nodes():
        size += _inline_size(child)
        if size > MAX_INLINE_NODES:
            return _NOT_INLINE
    return size


def _too_slow(seconds: float | None = None) -> str:
    return f"took longer than {seconds or deadline.current_bound():g} s"


_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.DOTALL)


def _describe(exc: BaseException) -> str:
    """A compile error in words (a run-time one is :func:`explain`'s, with its context)."""
    return explain(exc)


MAX_EXPRESSION_CHARS = 4000
"""The longest string holding an expression (``{{``, ``{%``): about 0.15 s to compile."""

MAX_EXPRESSION_DEPTH = 32
"""How deeply an expression's syntax may nest (``a + b + c`` nests once per ``+``)."""

COMPILED_CACHE = 1024


def _depth(tree: nodes.Node) -> int:
    """How deeply ``tree`` nests (without recursion: it may be deep)."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        if deepest > MAX_EXPRESSION_DEPTH:
            return deepest
        todo.extend((child, level + 1) for child in node.iter_child_nodes())
    return deepest


@functools.lru_cache(maxsize=COMPILED_CACHE)
def _compile_string(source: str) -> tuple[_Fn, int, frozenset[str]]:
    """One string's compiled form; remembered (it is pure), so the definition's check when it
    is saved and the engine's first run of it share one compile in one process."""
    whole = _WHOLE.match(source)
    is_whole = bool(whole and "{{" not in whole["expr"] and "}}" not in whole["expr"])
    if not is_whole and "{{" not in source and "{%" not in source:
        return (lambda _ctx: source), 0, frozenset()
    try:
        tree = SANDBOX.parse(source)
        size = _inline_size(tree)
        names = frozenset(n.name for n in tree.find_all(nodes.Name))
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
                raise ExpressionError(f"{source!r}: {_too_slow()}") from None
            except Exception as exc:
                raise ExpressionError(f"{source!r}: {explain(exc, ctx)}") from exc

        return native, size, names

    def text(ctx: dict[str, Any]) -> Any:
        try:
            return template.render(ctx)
        except TooSlow:
            raise ExpressionError(f"{source!r}: {_too_slow()}") from None
        except Exception as exc:
            raise ExpressionError(f"{source!r}: {explain(exc, ctx)}") from exc

    return text, size, names


def _compile(value: Any) -> tuple[_Fn, int, frozenset[str]]:
    """The evaluating function, the size that decides whether it may run in place, and the
    context names it uses."""
    if isinstance(value, str):
        return _compile_string(value)
    if isinstance(value, dict):
        parts = {k: _compile(v) for k, v in value.items()}
        fns = {k: fn for k, (fn, _, _) in parts.items()}
        size = sum(n for _, n, _ in parts.values())
        names = frozenset().union(*(used for _, _, used in parts.values()))
        return (lambda ctx: {k: fn(ctx) for k, fn in fns.items()}), size, names
    if isinstance(value, list):
        items = [_compile(v) for v in value]
        seq = [fn for fn, _, _ in items]
        names = frozenset().union(*(used for _, _, used in items))
        return (lambda ctx: [fn(ctx) for fn in seq]), sum(n for _, n, _ in items), names
    return (lambda _ctx: value), 0, frozenset()


def compile_value(value: Any) -> Renderer:
    """Compile a JSON value whose strings may hold expressions; raises ExpressionError."""
    fn, size, names = _compile(value)
    return Renderer(fn, inline=size <= MAX_INLINE_NODES, names=names)


def referenced_steps(value: Any) -> set[str]:
    """The step ids a value's expressions name literally (``steps.price`` or
    ``steps['price']``); none for a template that assigns ``steps`` itself. Call on a value
    that compiles."""
    found: set[str] = set()
    for source in strings_in(value):
        if "steps" not in source or ("{{" not in source and "{%" not in source):
            continue
        tree = SANDBOX.parse(source)
        if any(t.name == "steps" for t in tree.find_all(nodes.Name) if t.ctx != "load"):
            continue
        for attr in tree.find_all(nodes.Getattr):
            if isinstance(attr.node, nodes.Name) and attr.node.name == "steps":
                found.add(attr.attr)
        for item in tree.find_all(nodes.Getitem):
            key, base = item.arg, item.node
            named = isinstance(base, nodes.Name) and base.name == "steps"
            if named and isinstance(key, nodes.Const) and isinstance(key.value, str):
                found.add(key.value)
    return found


Path = tuple[str | int, ...]
"""A value's place in an expression's context: ``("payload", "items", 0, "sku")``."""


def read_paths(source: str) -> tuple[Path, ...]:
    """The values an expression reads by a literal path (``payload.amount``,
    ``steps.price.output['total']``, ``payload.items[0]``), outermost reads only, in the
    order written, each once: what a condition's failure shows it read. Call on a string
    that compiles."""
    if "{{" not in source and "{%" not in source:
        return ()
    found: list[Path] = []

    def walk(node: nodes.Node) -> None:
        path = _as_path(node)
        if path is not None:
            if path not in found:
                found.append(path)
            return
        for child in node.iter_child_nodes():
            walk(child)

    walk(SANDBOX.parse(source))
    return tuple(found)


def _as_path(node: nodes.Node) -> Path | None:
    if isinstance(node, nodes.Name):
        return (node.name,) if node.ctx == "load" else None
    if isinstance(node, nodes.Getattr):
        base = _as_path(node.node)
        return None if base is None else (*base, node.attr)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        key = node.arg.value
        base = _as_path(node.node)
        ok = isinstance(key, str | int) and not isinstance(key, bool)
        return None if base is None or not ok else (*base, key)
    return None


def check_size(value: Any) -> None:
    """Raise :class:`ExpressionError` for a string of ``value`` whose expression is longer
    than :data:`MAX_EXPRESSION_CHARS` or nests deeper than :data:`MAX_EXPRESSION_DEPTH`:
    what a definition is checked for when it is saved, before anything of it is compiled.
    (A stored definition is compiled as it is: caps never break a flow saved before them.)"""
    for source in strings_in(value):
        if "{{" not in source and "{%" not in source:
            continue
        if len(source) > MAX_EXPRESSION_CHARS:
            raise ExpressionError(
                f"is {len(source)} characters long, more than the {MAX_EXPRESSION_CHARS} an "
                "expression may have; split it over several steps or fields"
            )
        try:
            tree = SANDBOX.parse(source)
        except TemplateError as exc:
            raise ExpressionError(f"{source!r}: {_describe(exc)}") from exc
        if _depth(tree) > MAX_EXPRESSION_DEPTH:
            raise ExpressionError(
                f"{source[:60]!r}…: nests deeper than {MAX_EXPRESSION_DEPTH} levels (a chain "
                "of that many operators); split it into steps"
            )


def expression_chars(value: Any) -> int:
    """The characters of a value's strings that hold expressions (what compiling costs)."""
    return sum(len(s) for s in strings_in(value) if "{{" in s or "{%" in s)


def strings_in(value: Any) -> list[str]:
    """Every string in a JSON value (its keys left out), depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []
