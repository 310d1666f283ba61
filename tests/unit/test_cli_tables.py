"""The remote CLI's tables on a narrow terminal: ids are never cut (a cut id is one that
`deliveries replay` or `runs show` then answers 404 for); the other columns give way."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from flowhook.cli_remote import output as cli_remote

IDS = ["dlv_01m8jysds2egrbyt0qg80abcde", "dlv_01m8jysds2egrbyt0qg80fghjk"]


def test_ids_stay_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(cli_remote, "console", Console(file=out, width=80, color_system=None))
    rows = [
        [d, "evt_01m8jysds2egrbyt0qg80zzzzz", "flow.completed", "a long status text " * 3, None]
        for d in IDS
    ]
    cli_remote.table(["id", "event", "type", "last error", "next"], rows, "none")
    text = out.getvalue()
    assert all(line == line[:80] for line in text.splitlines())
    for d in [*IDS, "evt_01m8jysds2egrbyt0qg80zzzzz"]:
        assert d in text, text  # on one line, not cut or folded


def test_an_empty_table_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(cli_remote, "console", Console(file=out, width=80, color_system=None))
    cli_remote.table(["id"], [], "no deliveries")
    assert out.getvalue().strip() == "no deliveries"
