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


STORE_ONLY_EXCEPTIONS = {"engine/executor.py", "engine/worker.py"}
"""Modules outside ``store/`` that still import SQLAlchemy (for the ``AsyncConnection`` type):
the engine's, which its own rewrite moves to ``flowhook.store.db.Connection``. Only
``engine/`` files may be listed here."""


def _outside_the_store() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] != "store")


def test_only_the_store_imports_sqlalchemy() -> None:
    """All SQL lives in ``store/`` (STYLE.md habit 2): no module above it imports SQLAlchemy,
    not even for a type (``flowhook.store.db.Connection`` names the connection)."""
    assert all(name.startswith("engine/") for name in STORE_ONLY_EXCEPTIONS)
    offenders = []
    for path in _outside_the_store():
        name = str(path.relative_to(ROOT))
        if name in STORE_ONLY_EXCEPTIONS:
            continue
        offenders += [
            f"{name} imports {i}"
            for i in imports_of(path)
            if i == "sqlalchemy" or i.startswith("sqlalchemy.")
        ]
    assert offenders == []


BACKENDS = {"sqlite", "postgresql", "postgres"}


def _backend_branches(path: Path) -> list[str]:
    """Where ``path`` tells the backends apart: a backend's name compared (``==``, ``in``,
    ``startswith``), or a connection's or database's ``dialect`` / ``is_sqlite`` read."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value in BACKENDS for s in sides):
                found.append(f"line {node.lineno}: compares a backend's name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "startswith" and any(
                isinstance(a, ast.Constant) and a.value in BACKENDS for a in node.args
            ):
                found.append(f"line {node.lineno}: startswith a backend's name")
        elif isinstance(node, ast.Attribute) and node.attr in ("dialect", "is_sqlite"):
            found.append(f"line {node.lineno}: reads .{node.attr}")
    return found


def test_no_backend_branch_outside_the_store() -> None:
    """What differs between SQLite and PostgreSQL is the store driver's to know
    (``flowhook.store.driver``): the layers above ask it by name (``db.listen_dsn``,
    ``db.driver.one_writer``), never which backend it is."""
    offenders = [
        f"{path.relative_to(ROOT)} {where}"
        for path in _outside_the_store()
        for where in _backend_branches(path)
    ]
    assert offenders == []


def test_the_backend_check_finds_a_branch(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "if db.dialect == 'postgresql':\n    pass\n"
        'if conn.dialect.name != "sqlite":\n    pass\n'
        "ok = url.startswith('sqlite')\n"
        "if db.is_sqlite:\n    pass\n"
    )
    found = _backend_branches(probe)
    assert len([f for f in found if "compares" in f]) == 2
    assert any("startswith" in f for f in found) and any("is_sqlite" in f for f in found)
