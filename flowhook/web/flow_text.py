"""A flow definition as people type it on the settings screen: JSON or YAML text read into a
definition, every problem found placed on the line it is about, and two versions compared
line by line.

YAML is read with the safe loader and no aliases (``*name``): an alias lets a few bytes of
text stand for an exponentially large value (the "billion laughs"), which the definition's
checks would then walk. A problem's line is found by composing the text as YAML (JSON is
YAML too) and following the problem's field (``definition.steps[1].request.url``) through
the nodes; a field the text lacks (a missing required one) is placed on its parent's line.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

__all__ = [
    "FORMATS",
    "MAX_TEXT",
    "Problem",
    "read_definition",
    "as_text",
    "line_of",
    "lines_of",
    "diff_lines",
    "DiffLine",
]

FORMATS = ("json", "yaml")
MAX_TEXT = 512 * 1024
"""The longest definition text the editor takes, in characters."""


@dataclass(frozen=True, slots=True)
class Problem:
    message: str
    field: str | None
    line: int | None
    """1-based; ``None`` when the problem is about the whole text."""


class _NoAliases(yaml.SafeLoader):
    """The safe loader, refusing aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                None, None, "aliases (*name) are not allowed here: write the value out",
                event.start_mark,
            )  # fmt: skip
        return super().compose_node(parent, index)


# Plain scalars resolve to JSON's types only: no dates or times (a flow's `until` stays the
# text it is written as).
_NoAliases.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in found if tag != "tag:yaml.org,2002:timestamp"]
    for first, found in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_definition(text: str, fmt: str) -> tuple[Any, Problem | None]:
    """(definition, None), or (None, why the text is no JSON or YAML document)."""
    if len(text) > MAX_TEXT:
        return None, Problem(
            f"the text is {len(text):,} characters, more than {MAX_TEXT:,}", None, None
        )
    if fmt == "yaml":
        try:
            loaded = yaml.load(text, Loader=_NoAliases)  # noqa: S506 - a safe loader
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            reason = exc.problem or exc.context or "not valid YAML"
            return None, Problem(f"not valid YAML: {reason}", None, mark.line + 1 if mark else None)
        except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
            return None, Problem(f"not valid YAML: {str(exc)[:200]}", None, None)
        try:  # what JSON cannot hold (!!binary, !!set, a key that is a list) is refused here
            json.dumps(loaded, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return None, Problem(f"YAML that is not JSON: {str(exc)[:200]}", None, None)
        return loaded, None
    try:
        return json.loads(text, parse_constant=_reject_constant), None
    except json.JSONDecodeError as exc:
        return None, Problem(f"not valid JSON: {exc.msg} (column {exc.colno})", None, exc.lineno)
    except ValueError as exc:
        return None, Problem(f"not valid JSON: {exc}", None, None)
    except RecursionError:
        return None, Problem("not valid JSON: it nests too deeply", None, None)


def as_text(definition: Any, fmt: str) -> str:
    """The definition as the editor shows it: indented JSON, or block-style YAML, keys in
    the order they were written."""
    if fmt == "yaml":
        return str(yaml.safe_dump(definition, sort_keys=False, allow_unicode=True, width=100))
    return json.dumps(definition, indent=2, ensure_ascii=False) + "\n"


_PART = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def _path(field: str) -> list[str | int]:
    rest = field.removeprefix("definition")
    return [name if name else int(index) for name, index in _PART.findall(rest)]


def lines_of(text: str, fields: list[str | None]) -> list[int | None]:
    """The 1-based line of ``text`` where each of ``fields`` is written (or, when the text
    lacks it, where the nearest field holding it is); ``None`` for a field that is ``None``
    or when the text cannot be composed. The text is composed once for all of them."""
    if not any(fields):
        return [None] * len(fields)
    try:
        root = yaml.compose(text, Loader=_NoAliases)
    except (yaml.YAMLError, RecursionError, ValueError):
        return [None] * len(fields)
    return [None if root is None or f is None else _walk(root, f) for f in fields]


def line_of(text: str, field: str | None) -> int | None:
    """:func:`lines_of` for one field."""
    return lines_of(text, [field])[0]


def _walk(node: Any, field: str) -> int:
    line = node.start_mark.line
    for part in _path(field):
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            found = next(((k, v) for k, v in node.value if k.value == part), None)
            if found is None:
                break
            line, node = found[0].start_mark.line, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return int(line) + 1


@dataclass(frozen=True, slots=True)
class DiffLine:
    kind: str
    """``add``, ``del``, ``same`` or ``gap`` (lines left out between two hunks)."""
    text: str
    old: int | None
    new: int | None


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def diff_lines(old: Any, new: Any, *, context: int = 3) -> list[DiffLine]:
    """The two definitions' JSON compared line by line: what was taken out, what was put
    in, ``context`` unchanged lines around each change; empty when they are the same."""
    a = as_text(old, "json").splitlines()
    b = as_text(new, "json").splitlines()
    lines: list[DiffLine] = []
    old_no = new_no = 0
    for i, row in enumerate(difflib.unified_diff(a, b, lineterm="", n=context)):
        if i < 2:  # the "--- " and "+++ " headers
            continue
        hunk = _HUNK.match(row)
        if hunk:
            old_no, new_no = int(hunk.group(1)), int(hunk.group(2))
            lines.append(DiffLine("gap", row, None, None))
        elif row.startswith("-"):
            lines.append(DiffLine("del", row[1:], old_no, None))
            old_no += 1
        elif row.startswith("+"):
            lines.append(DiffLine("add", row[1:], None, new_no))
            new_no += 1
        else:
            lines.append(DiffLine("same", row[1:], old_no, new_no))
            old_no += 1
            new_no += 1
    return lines
