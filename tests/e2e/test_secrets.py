"""The secret key as real processes meet it: `flowhook serve` on SQLite makes its key file
once (mode 0600) and says so; `serve`, `api` and `worker` on PostgreSQL without
FLOWHOOK_SECRET_KEY refuse to start and say how to make one."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support import FLOWHOOK, serve

pytestmark = pytest.mark.e2e


def test_serve_on_sqlite_makes_its_key_file_once_and_says_so(tmp_path: Path) -> None:
    database = tmp_path / "flowhook.db"
    key_file = tmp_path / "flowhook.db.key"
    with serve(tmp_path, f"sqlite:///{database}", FLOWHOOK_SECRET_KEY="") as first:
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        said = [line for line in first.output if "key file" in line]
        assert len(said) == 1 and str(key_file) in said[0]
        assert not any(key in line for line in first.output)
    with serve(tmp_path, f"sqlite:///{database}", FLOWHOOK_SECRET_KEY="") as again:
        assert not any("key file" in line for line in again.output)
    assert key_file.read_text().strip() == key


@pytest.mark.parametrize("command", ["serve", "api", "worker"])
def test_postgresql_without_a_key_refuses_to_start(tmp_path: Path, command: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLOWHOOK_SECRET_KEY"}
    env["FLOWHOOK_DATABASE_URL"] = "postgresql://flowhook@127.0.0.1:9/never-reached"
    done = subprocess.run(
        [FLOWHOOK, command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "FLOWHOOK_SECRET_KEY is not set" in message
    assert "flowhook secrets generate-key" in message


def test_a_malformed_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    bad = "not-a-real-key-but-a-secret-all-the-same"
    env = {**os.environ, "FLOWHOOK_SECRET_KEY": bad, "FLOWHOOK_DATABASE_URL": "sqlite:///x.db"}
    done = subprocess.run(
        [FLOWHOOK, "worker"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "FLOWHOOK_SECRET_KEY" in done.stderr and bad not in done.stdout + done.stderr
