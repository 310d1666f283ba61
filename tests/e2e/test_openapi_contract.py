"""The OpenAPI document tells the whole truth, as an outsider checks it: the ``schemathesis``
command, with every check and every phase (examples, coverage, fuzzing, and the stateful
phase that follows the document's links from each create to the operations on what it
made), run over real HTTP against a real server, must report no failure and reach every
operation.

The rules a JSON Schema cannot state (unique step ids, a cron's frequency, a public URL) are
kept by tests/e2e/schemathesis_hooks.py for the cases meant to be valid; the document states
them in words. Deterministic (derandomized generation) and bounded (tests/e2e/schemathesis.toml
sets the examples per operation and the stateful scenarios: about two minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Server, serve

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

ROOT = Path(__file__).resolve().parents[2]
SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
CONFIG = Path(__file__).with_name("schemathesis.toml")
EXCLUDED = ["/api/v1/events/stream", "/api/v1/flows/runs/{run_id}/stream"]
"""Server-Sent Event streams, which end when their run ends or never (the workspace's): a
fuzzer that reads each answer to its end cannot call them (tests/e2e/test_streams.py does)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    cwd: Path = tmp_path_factory.mktemp("contract")
    with serve(
        cwd,
        f"sqlite:///{cwd / 'contract.db'}",
        FLOWHOOK_LOG_LEVEL="warning",
        FLOWHOOK_MAX_SCHEDULES="100000",  # the generator makes many; the limit has its own test
    ) as s:
        yield s


def _run(server: Server, report: Path) -> subprocess.CompletedProcess[str]:
    """The ``schemathesis`` command, from the report's directory: it keeps its crash cache
    (``.schemathesis/``) there, so each run starts afresh and the checkout stays clean."""
    key = server.value("sandbox key")
    command = [
        SCHEMATHESIS, "--config-file", str(CONFIG), "run", f"{server.base}/api/v1/openapi.json",
        "--checks", "all",
        "--phases", "examples,coverage,fuzzing,stateful",
        "--generation-deterministic",
        "--generation-allow-x00", "false",  # NUL is refused in any JSON string: see the hooks
        "--header", f"Authorization: Bearer {key}",
        *(a for path in EXCLUDED for a in ("--exclude-path", path)),
        "--request-timeout", "30",
        "--workers", "1",
        "--suppress-health-check", "all",
        "--continue-on-failure",
        "--report", "json", "--report-json-path", str(report),
        "--no-color",
    ]  # fmt: skip
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        command,
        cwd=report.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def test_schemathesis_finds_nothing_and_reaches_every_operation(
    server: Server, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = _run(server, report)
    output = result.stdout[-30000:] + result.stderr[-5000:]
    print(output)  # the counts, in the test's output
    assert result.returncode == 0, output
    summary: dict[str, Any] = json.loads(report.read_text())
    assert summary["failures"] == [] and summary["errors"] == [], output
    assert summary["test_cases"]["with_failures"] == 0, output
    assert {name: p["status"] for name, p in summary["phases"].items()} == {
        "examples": "success",
        "coverage": "success",
        "fuzzing": "success",
        "stateful": "success",
    }
    document = httpx.get(f"{server.base}/api/v1/openapi.json").json()
    operations = [
        (method, path)
        for path, item in document["paths"].items()
        for method in item
        if path not in EXCLUDED
    ]
    counts = summary["operations"]
    assert counts["selected"] == counts["tested"] == len(operations), counts
    assert counts["errored"] == counts["skipped"] == 0, counts
