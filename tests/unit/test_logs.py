"""FLOWHOOK_LOG_FORMAT: text a person reads on a terminal, JSON lines elsewhere (``auto``, the
default), or either by setting; each line carries the run, flow and request of its work."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from flowhook import logs
from flowhook.config import Settings


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _line(stream: io.StringIO, fmt: str) -> str:
    logs.configure("info", fmt, stream=stream)
    token = logs.run_id.set("run_01")
    try:
        logging.getLogger("flowhook.engine").warning("run %s: store unavailable", "run_01")
    finally:
        logs.run_id.reset(token)
    return stream.getvalue().strip()


def test_auto_writes_text_to_a_terminal() -> None:
    line = _line(Terminal(), "auto")
    assert " warning engine " in line
    assert line.endswith("run run_01: store unavailable  run=run_01")
    assert not line.startswith("{")


def test_auto_writes_json_lines_elsewhere() -> None:
    entry = json.loads(_line(io.StringIO(), "auto"))
    assert entry["level"] == "warning" and entry["logger"] == "flowhook.engine"
    assert entry["run_id"] == "run_01"


def test_the_setting_wins_over_the_terminal() -> None:
    assert json.loads(_line(Terminal(), "json"))["message"] == "run run_01: store unavailable"
    assert "warning engine" in _line(io.StringIO(), "text")


def test_auto_is_the_default_and_an_unknown_format_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLOWHOOK_LOG_FORMAT", raising=False)
    assert Settings().log_format == "auto"
    monkeypatch.setenv("FLOWHOOK_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="log_format"):
        Settings()
