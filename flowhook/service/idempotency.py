"""Idempotency-Keys of executes: a request's hash, the key's scope and its window (a key older
than ``IDEMPOTENCY_WINDOW`` is forgotten, and a new request may use it)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import orjson

from flowhook.errors import InvalidInput
from flowhook.service.auth import Principal
from flowhook.store import runs as runs_store
from flowhook.store.db import Connection
from flowhook.store.models import Mode, Run

__all__ = [
    "IDEMPOTENCY_WINDOW",
    "MAX_IDEMPOTENCY_KEY",
    "Keyed",
    "request_hash",
    "body_hash",
    "check_key",
    "keyed_runs",
    "within_window",
    "keyed_earlier",
]

IDEMPOTENCY_WINDOW = timedelta(hours=24)
MAX_IDEMPOTENCY_KEY = 255


def request_hash(flow_id: str, trigger: str, payload: dict[str, Any]) -> str:
    body = {"flow_id": flow_id, "trigger": trigger, "payload": payload}
    return body_hash(body)


def body_hash(body: dict[str, Any]) -> str:
    """SHA-256 of ``body`` as canonical JSON (sorted keys): what a request's key is bound to."""
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def check_key(key: str | None) -> None:
    if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
        raise InvalidInput(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
            field="Idempotency-Key",
        )


Keyed = tuple[str, Mode, str]
"""An Idempotency-Key in its scope: workspace, mode, key."""


async def keyed_runs(
    conn: Connection, keys: Iterable[Keyed]
) -> dict[Keyed, tuple[Run, str | None] | None]:
    """The runs that earlier requests started with ``keys``, with their requests' hashes,
    read in one statement per workspace and mode (a batch of accepts has one); a key no
    run holds is left out."""
    scopes: dict[tuple[str, Mode], set[str]] = {}
    for workspace_id, mode, key in keys:
        scopes.setdefault((workspace_id, mode), set()).add(key)
    found: dict[Keyed, tuple[Run, str | None] | None] = {}
    for (workspace_id, mode), scope in scopes.items():
        runs = await runs_store.find_by_idempotency_keys(conn, workspace_id, mode, scope)
        found.update(((workspace_id, mode, key), seen) for key, seen in runs.items())
    return found


async def within_window(
    conn: Connection, seen: tuple[Run, str | None] | None, now: datetime
) -> tuple[Run, str | None] | None:
    """``seen`` (a run an Idempotency-Key started) while the key is within its window; a
    key older than that is forgotten here."""
    if seen is not None and seen[0].queued_at <= now - IDEMPOTENCY_WINDOW:
        await runs_store.release_idempotency_key(conn, seen[0].run_id)
        return None
    return seen


async def keyed_earlier(
    conn: Connection, who: Principal, key: str, now: datetime
) -> tuple[Run, str | None] | None:
    """The run an Idempotency-Key started within its window, with its request's hash."""
    scoped = (who.workspace_id, who.mode, key)
    return await within_window(conn, (await keyed_runs(conn, [scoped])).get(scoped), now)
