"""Layers import one way (STYLE.md habit 1): api, web, cli → service → store;
engine and webhooks → store; the SDK imports no server code. The API and the pages are
siblings: neither imports the other, what both need is ``flowhook.serving`` below them, and
only the composition root (``flowhook.app``) imports both."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "flowhook"

FACES = ("flowhook.api", "flowhook.web")
"""The two HTTP faces: siblings, composed by the root alone."""

COMPOSITION_ROOT = "flowhook.app"

PENDING: dict[tuple[str, str], str] = {
    ("flowhook.api.app", "flowhook.app"): "a shim, for the bench scripts: bench/ab.sh runs this "
    "checkout's scripts on older commits too, where the app was flowhook.api.app's",
}
"""Imports that point the wrong way on purpose (module, the name it imports): why."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "store": (
        "flowhook.service",
        "flowhook.serving",
        "flowhook.api",
        "flowhook.web",
        "flowhook.app",
        "flowhook.engine",
        "flowhook.webhooks",
        "flowhook.cli",
        "flowhook.events",
    ),
    "service": (
        "flowhook.serving",
        "flowhook.api",
        "flowhook.web",
        "flowhook.app",
        "flowhook.engine",
        "flowhook.webhooks",
        "flowhook.cli",
    ),
    "serving": ("flowhook.api", "flowhook.web", "flowhook.app", "flowhook.cli"),
    "engine": (
        "flowhook.service",
        "flowhook.serving",
        "flowhook.api",
        "flowhook.web",
        "flowhook.app",
        "flowhook.cli",
    ),
    "webhooks": (
        "flowhook.service",
        "flowhook.serving",
        "flowhook.api",
        "flowhook.web",
        "flowhook.app",
        "flowhook.cli",
    ),
    "definition": (
        "flowhook.service",
        "flowhook.serving",
        "flowhook.api",
        "flowhook.web",
        "flowhook.app",
        "flowhook.engine",
        "flowhook.store",
        "flowhook.cli",
    ),
}


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, and for ``from m import n`` also ``m.n`` (``n`` may be
    a module: ``from flowhook import app``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Iterator[tuple[str, set[str]]]:
    """(module, what it imports) for every module of the package, migrations aside."""
    for path in sorted(ROOT.rglob("*.py")):
        if "migrations" not in path.parts:
            yield module_name(path), imports_of(path)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def pending(module: str, name: str) -> bool:
    return any(m == module and within(name, n) for m, n in PENDING)


def offences(pairs: Iterator[tuple[str, str]]) -> list[str]:
    return sorted(f"{m} imports {n}" for m, n in pairs if not pending(m, n))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_down(layer: str) -> None:
    offenders = []
    for path in (ROOT / layer).rglob("*.py"):
        for name in imports_of(path):
            bad = any(within(name, forbidden) for forbidden in FORBIDDEN[layer])
            if bad and not pending(module_name(path), name):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_web_and_api_never_import_each_other() -> None:
    found = offences(
        (m, n)
        for m, names in modules()
        for face, other in (FACES, FACES[::-1])
        if within(m, face)
        for n in names
        if within(n, other) or within(n, COMPOSITION_ROOT)
    )
    assert found == []


def test_nothing_but_the_composition_root_imports_a_face() -> None:
    found = offences(
        (m, n)
        for m, names in modules()
        if m != COMPOSITION_ROOT and not any(within(m, face) for face in FACES)
        for n in names
        if any(within(n, face) for face in FACES)
    )
    assert found == []


def test_only_the_composition_root_imports_both_faces() -> None:
    both = {
        m for m, names in modules() if all(any(within(n, face) for n in names) for face in FACES)
    }
    assert both == {COMPOSITION_ROOT}


def test_nothing_imports_the_composition_root_but_the_cli() -> None:
    found = offences(
        (m, n)
        for m, names in modules()
        if m != "flowhook.cli"
        for n in names
        if within(n, COMPOSITION_ROOT)
    )
    assert found == []


def test_sdk_imports_no_server_code() -> None:
    sdk = ROOT / "client"
    for path in sdk.rglob("*.py") if sdk.exists() else []:
        assert not any(
            n.startswith("flowhook.") and not n.startswith("flowhook.client")
            for n in imports_of(path)
        ), path


def test_the_cli_starts_without_the_server_stack() -> None:
    """`flowhook --help` and the remote commands import the SDK and the CLI, not the server:
    each command imports the stack it runs (the CPU it saves: bench/README.md)."""
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


def _outside_the_store() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] != "store")


def test_only_the_store_imports_sqlalchemy() -> None:
    """All SQL lives in ``store/`` (STYLE.md habit 2): no module above it imports SQLAlchemy,
    not even for a type (``flowhook.store.db.Connection`` names the connection)."""
    offenders = []
    for path in _outside_the_store():
        name = str(path.relative_to(ROOT))
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
