"""First start in JSON-log mode: the bootstrap keys reach standard output once as plain text;
the JSON log (standard error) says a workspace was made and never carries a key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support import FLOWHOOK, listening_port, secret_key_env

pytestmark = pytest.mark.e2e


def run_serve(cwd: Path, database_url: str) -> tuple[str, str]:
    """Start `flowhook serve` on a free port, wait until it answers, stop it: (stdout, stderr)."""
    env = {
        **os.environ,
        "FLOWHOOK_DATABASE_URL": database_url,
        "FLOWHOOK_PORT": "0",
        "FLOWHOOK_LOG_FORMAT": "json",
        "FLOWHOOK_LOG_LEVEL": "info",
        **secret_key_env(database_url),
    }
    proc = subprocess.Popen(
        [FLOWHOOK, "serve", "--access-log"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = ""
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the port it took comes first
        port = listening_port([first])
        assert port is not None, f"serve printed no port first: {first!r}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    return first + out, err


def test_bootstrap_keys_reach_the_terminal_and_never_the_json_log(
    tmp_path: Path, database_url: str
) -> None:
    out, err = run_serve(tmp_path, database_url)
    keys = [
        line.split(":", 1)[1].strip()
        for line in out.splitlines()
        if line.strip().startswith(("sandbox key:", "live key:"))
    ]
    assert len(keys) == 2 and keys[0].startswith("sk_test_") and keys[1].startswith("sk_live_")
    flow_id = next(ln for ln in out.splitlines() if "example flow:" in ln).split()[2]

    log = [json.loads(line) for line in err.splitlines() if line.strip()]  # JSON lines only
    assert log, err
    assert "sk_test_" not in err and "sk_live_" not in err
    assert not any(key in err for key in keys)
    made = [e for e in log if "created a workspace" in e["message"]]
    assert len(made) == 1 and flow_id in made[0]["message"]
    assert "printed once to standard output, not to this log" in made[0]["message"]

    # A second start on the same database prints no keys at all.
    out, err = run_serve(tmp_path, database_url)
    assert "sk_" not in out and "sk_" not in err
