"""Dependency floors that security depends on (issue 12)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {r.name: r for r in map(Requirement, project["dependencies"])}


def test_jinja2_releases_with_known_sandbox_escapes_are_excluded() -> None:
    jinja2 = _requirements()["jinja2"]
    assert not jinja2.specifier.contains("3.1.5") and jinja2.specifier.contains("3.1.6")
    assert Version(version("jinja2")) >= Version("3.1.6")


def test_cryptography_is_a_dependency_for_secrets_at_rest() -> None:
    assert "cryptography" in _requirements()
