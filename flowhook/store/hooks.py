"""Inbound hooks: public URLs bound to a flow (an arrival starts a run) or to a signal name (an
arrival sends that signal), and the provider delivery ids already seen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.crypto import SecretBox, cipher
from flowhook.store.models import Mode
from flowhook.store.rows import from_row, page
from flowhook.store.tables import inbound_dedup, inbound_hooks

__all__ = [
    "Hook",
    "insert_hook",
    "get_hook",
    "list_hooks",
    "delete_hook",
    "seen_delivery",
    "remember_delivery",
]


@dataclass(slots=True)
class Hook:
    id: str
    workspace_id: str
    mode: Mode
    flow_id: str | None
    """The flow each arrival starts a run of; ``None`` on a hook that sends ``signal``."""
    verify: dict[str, Any] | None
    dedup_header: str | None
    rate_limit: int
    created_at: datetime
    signal: str | None = None
    """The signal name each arrival sends (its body as the signal's ``data``)."""


def _verify(verify: dict[str, Any] | None, crypt: Callable[[str], str]) -> dict[str, Any] | None:
    """``verify`` with its secret sealed or opened (``crypt``: the box's seal or open)."""
    if not verify or not isinstance(verify.get("secret"), str):
        return verify
    return {**verify, "secret": crypt(verify["secret"])}


def _hook(row: Any, box: SecretBox) -> Hook:
    return from_row(Hook, row, {"mode": Mode}, verify=_verify(row.verify, box.open))


async def insert_hook(conn: AsyncConnection, hook: Hook) -> None:
    verify = _verify(hook.verify, cipher(conn).seal)
    await conn.execute(
        inbound_hooks.insert().values(
            id=hook.id, workspace_id=hook.workspace_id, mode=str(hook.mode), flow_id=hook.flow_id,
            signal=hook.signal, verify=verify, dedup_header=hook.dedup_header,
            rate_limit=hook.rate_limit, created_at=hook.created_at,
        )
    )  # fmt: skip


async def get_hook(
    conn: AsyncConnection, hook_id: str, workspace_id: str | None = None, mode: Mode | None = None
) -> Hook | None:
    q = select(inbound_hooks).where(inbound_hooks.c.id == hook_id)
    if workspace_id is not None:
        q = q.where(inbound_hooks.c.workspace_id == workspace_id, inbound_hooks.c.mode == str(mode))
    row = (await conn.execute(q)).first()
    return _hook(row, cipher(conn)) if row else None


async def list_hooks(
    conn: AsyncConnection, workspace_id: str, mode: Mode, *, limit: int, after: str | None
) -> list[Hook]:
    q = page(inbound_hooks, inbound_hooks.c.id, workspace_id, mode, limit=limit, after=after)
    box = cipher(conn)
    return [_hook(r, box) for r in (await conn.execute(q)).all()]


async def delete_hook(conn: AsyncConnection, hook_id: str) -> None:
    await conn.execute(delete(inbound_dedup).where(inbound_dedup.c.hook_id == hook_id))
    await conn.execute(delete(inbound_hooks).where(inbound_hooks.c.id == hook_id))


async def seen_delivery(conn: AsyncConnection, hook_id: str, key: str) -> str | None:
    """The run an earlier arrival with this provider delivery id started."""
    q = select(inbound_dedup.c.run_id).where(
        inbound_dedup.c.hook_id == hook_id, inbound_dedup.c.delivery_key == key
    )
    return (await conn.execute(q)).scalar_one_or_none()


async def remember_delivery(
    conn: AsyncConnection, hook_id: str, key: str, run_id: str, now: datetime
) -> None:
    await conn.execute(
        inbound_dedup.insert().values(
            hook_id=hook_id, delivery_key=key, run_id=run_id, created_at=now
        )
    )
