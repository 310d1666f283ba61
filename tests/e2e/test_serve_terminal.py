"""`flowhook serve` on a terminal, as a newcomer first sees it (under tmux, its screen written to
test-artifacts/): log lines a person reads, not JSON; one line for the migration of an empty
database (not one per revision, nor Alembic's plugins); the keys block set apart by blank
lines, with where the settings screen is. Off a terminal the log stays JSON lines
(tests/e2e/test_bootstrap_output.py)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.support import FLOWHOOK

pytestmark = pytest.mark.e2e

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (debug|info|warning|error) +\S+ +\S")


def _tmux(session: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-L", session, *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout


def test_first_start_on_a_terminal_reads_as_text(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing: apt-get install -y tmux (.ci/run does)")
    ARTIFACTS.mkdir(exist_ok=True)
    session = f"flowhook-serve-{uuid.uuid4().hex[:8]}"
    env = {
        "FLOWHOOK_DATABASE_URL": f"sqlite:///{tmp_path / 'first.db'}",
        "FLOWHOOK_PORT": "0",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command += f" {shlex.quote(FLOWHOOK)} serve --single-process"
    _tmux(session, "new-session", "-d", "-s", session, "-x", "160", "-y", "60",
          "env", "-u", "FLOWHOOK_LOG_FORMAT", "sh", "-c", command)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "sign in with the sandbox key" not in (
            screen := _tmux(session, "capture-pane", "-p", "-t", session)
        ):
            assert time.monotonic() < deadline, screen
            time.sleep(0.1)
    finally:
        subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True, timeout=30)
    (ARTIFACTS / "serve-first-start-terminal.txt").write_text(screen)
    lines = [line.rstrip() for line in screen.splitlines()]
    assert not [line for line in lines if line.startswith("{")], screen  # no JSON lines
    logged = [line for line in lines if LINE.match(line)]
    assert logged, screen
    migrated = [line for line in logged if "migrated an empty database to revision" in line]
    assert len(migrated) == 1, screen
    assert not [line for line in lines if "alembic" in line], screen
    start = lines.index(
        "Flowhook created a workspace on this empty database. These keys are shown once:"
    )
    assert lines[start - 1] == "", screen  # the keys stand apart from the log
    assert any(line.startswith("  sandbox key:  sk_test_") for line in lines[start:]), screen
    assert any("open the settings screen at http://127.0.0.1:" in line for line in lines)
