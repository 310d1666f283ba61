"""The SDK client a remote command talks through, its failures said in a line (exit 1), and
the look-ups several commands make: a flow by its name, every flow's name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import typer
from rich.markup import escape

from flowhook.cli_remote.output import err
from flowhook.client import APIError, Client, FlowhookClientError

__all__ = ["client", "resolve_flow", "flow_names"]


@contextmanager
def client() -> Iterator[Client]:
    url = os.environ.get("FLOWHOOK_URL", "http://127.0.0.1:8080")
    key = os.environ.get("FLOWHOOK_API_KEY")
    if not key:
        err.print(
            "[red]error:[/red] set FLOWHOOK_API_KEY to a sandbox or live key (and FLOWHOOK_URL if not local)"
        )
        raise typer.Exit(2)
    try:
        with Client(url, key) as c:
            yield c
    except APIError as exc:
        err.print(f"[red]error {exc.status}:[/red] {exc.error} [dim]({exc.code})[/dim]")
        raise typer.Exit(1) from None
    except FlowhookClientError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except httpx.ConnectError:
        err.print(
            f"[red]error:[/red] cannot reach Flowhook at {escape(url)}: is `flowhook serve` "
            "running? Set FLOWHOOK_URL otherwise.",
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    except (httpx.TransportError, OSError) as exc:  # a timeout, a connection cut short
        err.print(
            f"[red]error:[/red] the request to {escape(url)} failed: {_said(exc)}", soft_wrap=True
        )
        raise typer.Exit(1) from None


def _said(exc: BaseException) -> str:
    """An outside failure in words: its message, or its kind when it has none."""
    return escape(str(exc)) or type(exc).__name__


def resolve_flow(c: Client, flow: str) -> str:
    """The id of ``flow``: an id as it is, else the one flow of that name (exact, then
    ignoring case); a clear error, exit 2, for none or several."""
    if flow.startswith("wf_"):
        return flow
    every = c.list_flows()
    exact = [f for f in every if f["name"] == flow]
    found = exact or [f for f in every if f["name"].lower() == flow.lower()]
    if len(found) == 1:
        return str(found[0]["flow_id"])
    if len(found) > 1:
        ids = ", ".join(f["flow_id"] for f in found)
        err.print(f"[red]error:[/red] {len(found)} flows are named {flow!r} ({ids}); give its id")
        raise typer.Exit(2)
    err.print(f"[red]error:[/red] no flow is named {flow!r}; `flowhook flows list` shows them")
    raise typer.Exit(2)


def flow_names(c: Client) -> dict[str, str]:
    """Every flow's name by its id, to print beside the ids a list holds."""
    return {f["flow_id"]: f["name"] for f in c.list_flows()}
