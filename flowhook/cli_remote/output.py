"""What the remote commands print: tables sized for ids, one line about one thing, or the
API's JSON (``--json``); errors on standard error."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = [
    "console",
    "err",
    "out_json",
    "table",
    "listing",
    "shown",
    "parse_json",
    "parse_json_object",
]

console = Console()
err = Console(stderr=True)


def out_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


_AN_ID = re.compile(r"[a-z]+_[0-9a-z]{20,}")
"""The shape of this service's ids (``run_…``, ``dlv_…``): a table never cuts one, as a cut
id is one no command takes."""


def table(columns: list[str], rows: list[list[Any]], empty: str) -> None:
    if not rows:
        console.print(f"[dim]{empty}[/dim]")
        return
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    t = Table()
    for i, name in enumerate(columns):
        values = [row[i] for row in cells if row[i]]
        if values and all(_AN_ID.fullmatch(v) for v in values):
            # whole on one line, whatever the terminal's width: the other columns give way
            t.add_column(name, no_wrap=True, min_width=max(map(len, values)))
        else:
            t.add_column(name)
    for row in cells:
        t.add_row(*row)
    console.print(t)


def listing(
    data: list[Any], as_json: bool, columns: list[str], row: Callable[[Any], list[Any]], empty: str
) -> None:
    """A list command's answer: the items as JSON, or a table of ``row(item)`` each."""
    if as_json:
        out_json(data)
        return
    table(columns, [row(x) for x in data], empty)


def shown(value: Any, as_json: bool, text: Callable[[], str]) -> None:
    """A command's answer about one thing: ``value`` as JSON, or the line ``text()``."""
    if as_json:
        out_json(value)
    else:
        console.print(text())


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        err.print(f"[red]error:[/red] {what} is not valid JSON: {exc}")
        raise typer.Exit(2) from None


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object; anything else is an error, exit 2."""
    value = parse_json(text, what)
    if not isinstance(value, dict):
        err.print(f"[red]error:[/red] {what} must be a JSON object")
        raise typer.Exit(2)
    return value
