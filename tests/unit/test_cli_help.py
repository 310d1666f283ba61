"""``--help`` reads well: every command says what it does, a flag is written bare, a value
as a word (TEXT, INTEGER), an argument in capitals; no ``<bool>``, ``<str>`` or
``{flow_id}`` (typer 0.2x's own), and a docstring's lines are one paragraph."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from flowhook.cli import app
from flowhook.cli_remote import register

register(app)


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not getattr(sub, "hidden", False):
            yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(get_command(app)))


def _help(path: tuple[str, ...]) -> str:
    done = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
    assert done.exit_code == 0, done.output
    return done.output


def test_the_commands_a_user_reaches_for_are_there() -> None:
    for path in [
        ("runs", "approve"), ("runs", "reject"), ("flows", "show"), ("flows", "versions"),
        ("flows", "delete"), ("hooks", "list"), ("hooks", "show"), ("hooks", "rotate"),
        ("hooks", "delete"), ("schedules", "pause"), ("schedules", "resume"),
        ("schedules", "delete"), ("endpoints", "delete"), ("endpoints", "test"),
        ("endpoints", "show"),
    ]:  # fmt: skip
        assert path in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "flowhook")
def test_help_says_what_each_command_does_without_python_types(path: tuple[str, ...]) -> None:
    text = _help(path)
    assert not re.search(r"<(bool|str|int|float|path)>", text), text
    assert not re.search(r"\{[a-z_]+\}", text), text  # an argument in braces
    lines = text.splitlines()
    usage = next(i for i, line in enumerate(lines) if "Usage:" in line)
    said = next(line for line in lines[usage + 1 :] if line.strip(" │"))
    assert not said.strip().startswith("╭"), f"{' '.join(path)} has no description"


def test_a_docstring_reads_as_one_paragraph_and_values_as_words() -> None:
    text = _help(("worker",))
    assert "what is in flight, then unfinished runs" in " ".join(text.split())
    start = _help(("runs", "start"))
    assert re.search(r"--payload\s+TEXT", start) and re.search(r"--timeout\s+NUMBER", start)
    assert re.search(r"--wait\s+Follow", start)  # a flag: no type
    assert "FLOW" in next(line for line in start.splitlines() if "Usage:" in line)
