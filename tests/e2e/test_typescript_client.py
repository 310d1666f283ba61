"""A non-Python user is served by the OpenAPI document: TypeScript types generated from the
served document (openapi-typescript) type a ten-line client that executes a flow and reads the
run (tests/typescript/client.ts), and ``tsc --noEmit`` compiles it. A change to the document
that breaks such a client fails here.

Needs Node.js and ``npm ci`` in tests/typescript (``make test`` runs scripts/ensure-node).
Skipped without npm, except in CI (``CI=true``), where it must run."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import IN_CI
from tests.support import Server, serve

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parents[1] / "typescript"
BIN = HERE / "node_modules" / ".bin"


@pytest.fixture(scope="module")
def toolchain() -> Path:
    """tests/typescript with its pinned packages installed (``npm ci`` when they are not)."""
    npm = shutil.which("npm")
    if npm is None:
        if IN_CI:
            pytest.fail("npm is missing; CI must run the TypeScript check (scripts/ensure-node)")
        pytest.skip("npm is missing (apt-get install nodejs npm)")
    if not (BIN / "tsc").exists() or not (BIN / "openapi-typescript").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, capture_output=True
        )
    return BIN


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    cwd = tmp_path_factory.mktemp("ts")
    with serve(cwd, f"sqlite:///{cwd / 'ts.db'}", FLOWHOOK_LOG_LEVEL="warning") as s:
        yield s


def _compile(
    document: dict[str, Any], bin_dir: Path, where: Path
) -> subprocess.CompletedProcess[str]:
    """Generate ``flowhook.d.ts`` from ``document`` and compile the client against it."""
    for name in ("client.ts", "tsconfig.json"):
        shutil.copy(HERE / name, where / name)
    (where / "openapi.json").write_text(json.dumps(document))
    subprocess.run(
        [str(bin_dir / "openapi-typescript"), "openapi.json", "-o", "flowhook.d.ts"],
        cwd=where,
        check=True,
        capture_output=True,
        text=True,
    )
    return subprocess.run(
        [str(bin_dir / "tsc"), "--noEmit", "-p", "tsconfig.json"],
        cwd=where,
        capture_output=True,
        text=True,
    )


def test_a_typescript_client_compiles_against_the_served_document(
    toolchain: Path, served: Server, tmp_path: Path
) -> None:
    document = httpx.get(f"{served.base}/api/v1/openapi.json").raise_for_status().json()
    result = _compile(document, toolchain, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    types = (tmp_path / "flowhook.d.ts").read_text()
    assert "FlowStep_parallel" in types  # the flow definition's steps are typed too


def test_a_breaking_change_to_the_document_fails_the_check(
    toolchain: Path, served: Server, tmp_path: Path
) -> None:
    document = httpx.get(f"{served.base}/api/v1/openapi.json").raise_for_status().json()
    accepted = document["components"]["schemas"]["RunAccepted"]
    del accepted["properties"]["run_id"]
    accepted["required"].remove("run_id")
    result = _compile(document, toolchain, tmp_path)
    assert result.returncode != 0
    assert "run_id" in result.stdout + result.stderr
