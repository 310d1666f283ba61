"""Layers import one way (STYLE.md habit 1): api, web, cli → service → store;
engine and webhooks → store; nothing imports api or web; the SDK imports no server code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "flowhook"

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "store": (
        "flowhook.service",
        "flowhook.api",
        "flowhook.web",
        "flowhook.engine",
        "flowhook.webhooks",
        "flowhook.cli",
    ),
    "service": (
        "flowhook.api",
        "flowhook.web",
        "flowhook.engine",
        "flowhook.webhooks",
        "flowhook.cli",
    ),
    "engine": ("flowhook.service", "flowhook.api", "flowhook.web", "flowhook.cli"),
    "webhooks": ("flowhook.service", "flowhook.api", "flowhook.web", "flowhook.cli"),
    "definition": (
        "flowhook.service",
        "flowhook.api",
        "flowhook.web",
        "flowhook.engine",
        "flowhook.store",
        "flowhook.cli",
    ),
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_down(layer: str) -> None:
    offenders = []
    for path in (ROOT / layer).rglob("*.py"):
        for name in imports_of(path):
            if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[layer]):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_sdk_imports_no_server_code() -> None:
    sdk = ROOT / "client"
    for path in sdk.rglob("*.py") if sdk.exists() else []:
        assert not any(
            n.startswith("flowhook.") and not n.startswith("flowhook.client")
            for n in imports_of(path)
        ), path


def test_the_cli_starts_without_the_server_stack() -> None:
    """`flowhook --help` and the remote commands import the SDK and the CLI, not the server:
    each command imports the stack it runs (a remote command started in ~1.4 s of CPU
    before, ~0.3 s after; figures in docs/testing.md)."""
    import subprocess
    import sys

    probe = (
        "import sys; import flowhook.cli as c; from flowhook.cli_remote import register; "
        "register(c.app); print(sorted(m for m in ('sqlalchemy', 'uvicorn', 'fastapi', "
        "'alembic', 'aiohttp', 'jinja2', 'flowhook.store', 'flowhook.service') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout
