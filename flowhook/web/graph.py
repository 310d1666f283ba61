"""A flow drawn as a graph, server-side SVG (no script, nothing from a CDN): steps top to
bottom in order, a ``parallel`` step's branches side by side and a ``map`` step's steps in
a box, a sub-flow named by its flow's name, a ``condition`` step's jumps as arrows to the
step they skip to. Given each step's status (a run's page), the boxes take its colour.

The layout is a box model: a block (a list of steps) is as wide as its widest step and as
tall as its steps one under the other; a group (``parallel``, ``map``) is a box around its
blocks. Every size is known before anything is drawn, so the picture is one pass."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from markupsafe import Markup

__all__ = ["flow_graph"]

NODE_W, NODE_H = 200, 40
GAP = 22
"""Between two steps one under the other (the arrow's length)."""
PAD, HEAD, COL_GAP = 12, 26, 16
JUMP = 28
"""How far right of the steps a condition's jump arrow runs."""
LABEL = 26
"""Characters of a step's id shown; the whole id is the box's tooltip."""

Anchor = tuple[float, float, float, float]
"""A step's box: left, top, right, bottom."""
Paint = Callable[[float, float, list[str], dict[str, Anchor]], None]


@dataclass(frozen=True, slots=True)
class _Laid:
    width: float
    height: float
    paint: Paint
    """Draws it with its top left at (x, y) into the list of SVG elements, noting where each
    step's box went."""


def _short(text: str, size: int = LABEL) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


def flow_graph(
    definition: Mapping[str, Any],
    *,
    flow_names: Mapping[str, str] | None = None,
    status: Mapping[str, str] | None = None,
) -> Markup:
    """The definition's steps as an SVG picture; ``flow_names`` names the flows ``flow``
    steps call, ``status`` colours each step by its id (a run's)."""
    names, states = flow_names or {}, status or {}
    jumps: list[tuple[str, str, str]] = []  # (condition step, "then"/"else", target step)

    def node(step: Mapping[str, Any]) -> _Laid:
        step_id, kind = str(step.get("id", "?")), str(step.get("type", "?"))
        detail = kind
        if kind == "flow":
            target = str(step.get("flow_id", ""))
            detail = f"calls {_short(names.get(target, target), 20)}"
        elif kind == "task":
            detail = f"task {_short(str(step.get('task', '')), 21)}"
        elif kind == "wait":
            detail = f"wait for {_short(str(step.get('signal', '')), 17)}"
        if kind == "condition":
            for branch in ("then", "else"):
                goes = step.get(branch)
                if isinstance(goes, str) and goes not in ("continue", "end", "fail"):
                    jumps.append((step_id, branch, goes))

        def paint(x: float, y: float, out: list[str], at: dict[str, Anchor]) -> None:
            state = states.get(step_id, "")
            out.append(
                f'<g class="node {escape(kind)} {escape(state)}" data-step="{escape(step_id)}">'
                f"<title>{escape(step_id)} ({escape(kind)}){': ' + escape(state) if state else ''}"
                f'</title><rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6"/>'
                f'<text x="{x + 10}" y="{y + 17}" class="id">{escape(_short(step_id))}</text>'
                f'<text x="{x + 10}" y="{y + 32}" class="type">{escape(detail)}</text></g>'
            )
            at[step_id] = (x, y, x + NODE_W, y + NODE_H)

        return _Laid(NODE_W, NODE_H, paint)

    def group(step: Mapping[str, Any], title: str, columns: list[tuple[str, _Laid]]) -> _Laid:
        step_id = str(step.get("id", "?"))
        inner_w = sum(c.width for _, c in columns) + COL_GAP * (len(columns) - 1)
        labelled = any(label for label, _ in columns)
        inner_h = max(c.height for _, c in columns) + (HEAD if labelled else 0)
        width = max(inner_w + 2 * PAD, NODE_W)
        height = HEAD + inner_h + 2 * PAD

        def paint(x: float, y: float, out: list[str], at: dict[str, Anchor]) -> None:
            state = states.get(step_id, "")
            out.append(
                f'<g class="group {escape(state)}" data-step="{escape(step_id)}">'
                f"<title>{escape(step_id)}</title>"
                f'<rect x="{x}" y="{y}" width="{width}" height="{height}" rx="8"/>'
                f'<text x="{x + PAD}" y="{y + 18}" class="id">{escape(_short(step_id))}'
                f' <tspan class="type">{escape(title)}</tspan></text></g>'
            )
            at[step_id] = (x, y, x + width, y + height)
            cx = x + (width - inner_w) / 2
            for label, column in columns:
                top = y + HEAD + PAD
                if labelled:
                    out.append(
                        f'<text x="{cx}" y="{top + 14}" class="branch">{escape(_short(label))}</text>'
                    )
                    top += HEAD
                column.paint(cx, top, out, at)
                cx += column.width + COL_GAP

        return _Laid(width, height, paint)

    def item(step: Mapping[str, Any]) -> _Laid:
        kind = step.get("type")
        if kind == "parallel" and isinstance(step.get("branches"), Mapping):
            columns = [(str(name), block(steps)) for name, steps in step["branches"].items()]
            if columns:
                return group(step, "parallel", columns)
        if kind == "map" and isinstance(step.get("steps"), list) and step["steps"]:
            return group(step, "map: each item", [("", block(step["steps"]))])
        return node(step)

    def block(steps: Any) -> _Laid:
        laid = [item(s) for s in steps if isinstance(s, Mapping)] if isinstance(steps, list) else []
        if not laid:
            return _Laid(NODE_W, 0, lambda x, y, out, at: None)
        width = max(part.width for part in laid)
        height = sum(part.height for part in laid) + GAP * (len(laid) - 1)

        def paint(x: float, y: float, out: list[str], at: dict[str, Anchor]) -> None:
            middle = x + width / 2
            for i, part in enumerate(laid):
                if i:  # the arrow from the step above
                    out.append(
                        f'<line class="edge" x1="{middle}" y1="{y - GAP}" x2="{middle}" '
                        f'y2="{y - 3}" marker-end="url(#arrow)"/>'
                    )
                part.paint(x + (width - part.width) / 2, y, out, at)
                y += part.height + GAP

        return _Laid(width, height, paint)

    whole = block(definition.get("steps"))
    margin = 8
    out: list[str] = []
    at: dict[str, Anchor] = {}
    whole.paint(margin, margin, out, at)
    right = margin + whole.width
    for source, branch, target in jumps:
        if source not in at or target not in at:
            continue
        _, sy0, sx1, sy1 = at[source]
        _, ty0, tx1, ty1 = at[target]
        x_out = right + JUMP
        y1, y2 = (sy0 + sy1) / 2, (ty0 + ty1) / 2
        out.append(
            f'<path class="jump" d="M{sx1} {y1} C{x_out} {y1} {x_out} {y2} {tx1 + 3} {y2}" '
            f'marker-end="url(#jump)"/><text class="jump" x="{x_out - 4}" '
            f'y="{(y1 + y2) / 2}">{branch}</text>'
        )
    width = right + (JUMP + 30 if jumps else 0) + margin
    height = margin * 2 + whole.height
    defs = (
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="8" '
        'markerHeight="8" orient="auto"><path d="M0,0 L8,4 L0,8 z" class="head"/></marker>'
        '<marker id="jump" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="8" '
        'markerHeight="8" orient="auto"><path d="M0,0 L8,4 L0,8 z" class="jump-head"/>'
        "</marker></defs>"
    )
    # every text put in is escaped (html.escape) where it was written, the rest is numbers
    return Markup(  # noqa: S704
        f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="The flow\'s steps as a graph">{defs}{"".join(out)}</svg>'
    )


def called_flows(definition: Mapping[str, Any]) -> list[str]:
    """The flow ids the definition's ``flow`` steps call, nested ones too (to name them)."""
    found: list[str] = []

    def visit(steps: Any) -> None:
        for step in steps if isinstance(steps, list) else []:
            if not isinstance(step, Mapping):
                continue
            if step.get("type") == "flow" and isinstance(step.get("flow_id"), str):
                found.append(step["flow_id"])
            visit(step.get("steps"))
            branches = step.get("branches")
            for branch in branches.values() if isinstance(branches, Mapping) else []:
                visit(branch)

    visit(definition.get("steps"))
    return found


_RANK = {"failed": 5, "retrying": 4, "running": 3, "waiting": 3, "completed": 1, "skipped": 0}


def step_states(steps: Any) -> dict[str, str]:
    """Each step id's status in a run (its records, nested ones too); a step a ``map`` ran
    once per item shows the most telling of its items' (failed over running over done)."""
    found: dict[str, str] = {}
    for s in steps:
        state = str(s.status)
        if _RANK.get(state, 2) >= _RANK.get(found.get(s.step_id, ""), -1):
            found[s.step_id] = state
    return found
