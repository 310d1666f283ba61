"""``flowhook flows apply PATH…``: flow definitions kept as code, in the team's own repository,
applied from its deploy. Every file is read and checked by the server before anything is
saved, so one bad file changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.markup import escape

from flowhook.cli_remote.output import err
from flowhook.client import APIError, Client

__all__ = ["files", "load", "plan", "run", "Applied"]

SUFFIXES = (".json", ".yaml", ".yml")


def files(paths: list[Path]) -> list[Path]:
    """The definition files ``paths`` name: files as given, folders' files (sorted, in
    sub-folders too) of :data:`SUFFIXES`."""
    if not paths:
        err.print("[red]error:[/red] name the definitions to apply: flowhook flows apply flows/")
        raise typer.Exit(2)
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        elif path.is_file():
            found.append(path)
        else:
            err.print(f"[red]error:[/red] {escape(str(path))}: no such file or folder")
            raise typer.Exit(2)
    if not found:
        err.print("[red]error:[/red] no .json, .yaml or .yml file there")
        raise typer.Exit(2)
    return found


def load(paths: list[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Each file's definition; every file that cannot be read is named, then exit 1."""
    loaded, bad = [], []
    for path in paths:
        try:
            definition = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            bad.append(f"{path}: not valid YAML or JSON: {exc}")
            continue
        if not isinstance(definition, dict):
            bad.append(f"{path}: must hold a flow definition (a mapping)")
            continue
        loaded.append((path, definition))
    _stop_if(bad)
    return loaded


@dataclass
class Applied:
    """What applying one file does (or did)."""

    path: Path
    definition: dict[str, Any]
    flow_id: str | None = None
    version: int = 1
    result: str = "created"
    """created, new version, or unchanged."""

    def summary(self) -> dict[str, Any]:
        return {"file": str(self.path), "flow_id": self.flow_id, "result": self.result,
                "version": self.version}  # fmt: skip

    def line(self, dry_run: bool) -> str:
        what = {"created": "created", "unchanged": "unchanged"}.get(
            self.result, f"new version {self.version}"
        )
        if dry_run:
            what = {"created": "would be created", "unchanged": "unchanged"}.get(
                self.result, f"would be new version {self.version}"
            )
        flow = self.flow_id or "(a new flow)"
        return f"{escape(str(self.path))}: {what} {flow} [bold]{escape(self.definition['name'])}[/bold]"


def plan(
    c: Client, loaded: list[tuple[Path, dict[str, Any]]], flow_id: str | None
) -> list[Applied]:
    """What each file would do: checked by the server first (every file's problems named,
    then exit 1, before anything changes), its flow found by slug, ``flow_id`` or name."""
    checked: list[Applied] = []
    bad: list[str] = []
    for path, definition in loaded:
        try:
            checked.append(Applied(path, c.validate_flow(definition)))
        except APIError as exc:
            if exc.status != 400:
                raise
            bad.append(f"{path}: {exc.error}")
    slugs: list[str] = [str(a.definition["slug"]) for a in checked if a.definition.get("slug")]
    twice = sorted({s for s in slugs if slugs.count(s) > 1})
    bad += [f"slug {s!r} is in more than one file" for s in twice]
    _stop_if(bad)
    names = {f["name"]: f for f in c.list_flows()} if flow_id is None else {}
    for a in checked:
        slug = a.definition.get("slug")
        current = (
            c.get_flow(flow_id) if flow_id is not None
            else c.flow_by_slug(slug) if slug
            else names.get(a.definition["name"])
        )  # fmt: skip
        if current is None:
            continue
        a.flow_id = current["flow_id"]
        same = current["definition"] == a.definition
        a.result, a.version = (
            ("unchanged", current["version"]) if same else ("new version", current["version"] + 1)
        )
    return checked


def run(c: Client, planned: list[Applied]) -> list[Applied]:
    """Save what :func:`plan` found changed, in file order."""
    for a in planned:
        if a.result == "created":
            saved = c.create_flow(a.definition)
        elif a.result == "new version":
            assert a.flow_id is not None
            saved = c.update_flow(a.flow_id, a.definition)
        else:
            continue
        a.flow_id, a.version = saved["flow_id"], saved["version"]
    return planned


def _stop_if(bad: list[str]) -> None:
    if bad:
        for line in bad:
            err.print(f"[red]error:[/red] {escape(line)}")
        err.print("nothing was applied")
        raise typer.Exit(1)
