"""Sealing every stored secret (endpoints', hooks' and step secrets): plaintext rows written before secrets were encrypted
(the 0006 migration, and each start for rows an older process wrote since), and rows under
an older key (``flowhook secrets rotate``).

Works on a synchronous connection, so the migration (inside Alembic) and the async callers
(through ``run_sync``) share it. Tables are named here, not imported, so the migration keeps
working as ``tables.py`` moves on. A row changed meanwhile by the service is left alone (the
endpoint's UPDATE is guarded by the values it read; hooks are never updated in place).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from flowhook.errors import SecretKeyError
from flowhook.store.crypto import PREFIX, SecretBox
from flowhook.store.db import Database
from flowhook.store.types import IdType, JSONType

__all__ = ["Mode", "Resealed", "reseal", "reseal_batch", "reseal_in_batches", "KINDS"]


def _tables(id_type: sa.types.TypeEngine[str]) -> dict[str, sa.TableClause]:
    """The tables that hold secrets, by kind, with their ids of ``id_type`` (a step secret's
    id is random text whatever the schema)."""
    return {
        "endpoints": sa.table(
            "webhook_endpoints",
            sa.column("id", id_type),
            sa.column("secret", sa.Text),
            sa.column("previous_secret", sa.Text),
        ),
        "hooks": sa.table("inbound_hooks", sa.column("id", id_type), sa.column("verify", JSONType)),
        "step_secrets": sa.table(
            "step_secrets", sa.column("id", sa.String()), sa.column("value", sa.Text)
        ),
    }


_PACKED = _tables(IdType())
_TEXT = _tables(sa.String())
"""Ids as the store keeps them (migration 0023 on), and as text (what migration 0006, which
calls :func:`reseal`, reads and writes)."""

KINDS = ("endpoints", "hooks", "step_secrets")
_BEFORE_0023 = ("endpoints", "hooks")
"""What a schema with ids as text has (step secrets came with 0029)."""

_WHAT = {"endpoints": "webhook endpoint", "hooks": "hook", "step_secrets": "step secret"}


@dataclass
class Resealed:
    """What one pass did: values sealed anew, and the rows no key could open."""

    sealed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    unreadable: list[str] = field(default_factory=list)

    def add(self, kind: str, other: Resealed) -> None:
        self.sealed[kind] += other.sealed[kind]
        self.unreadable += other.unreadable

    def raise_if_unreadable(self, source: str) -> None:
        if self.unreadable:
            shown = ", ".join(self.unreadable[:5]) + (", …" if len(self.unreadable) > 5 else "")
            raise SecretKeyError(
                f"the secrets of {len(self.unreadable)} record(s) ({shown}) cannot be "
                f"decrypted with any key in {source}: list the key they were encrypted with "
                "after the newest, comma-separated, and run `flowhook secrets rotate` before "
                "dropping it"
            )


Mode = Literal["seal", "rotate", "open"]
"""seal: plaintext ones (and check the rest open); rotate: also those under an older key;
open: back to plaintext (the migration's downgrade)."""


def _next(box: SecretBox, stored: str | None, mode: Mode) -> str | None:
    """The value to store instead, or ``None`` to keep it (raises when no key opens it)."""
    if stored is None:
        return None
    if mode == "open":
        return box.open(stored) if stored.startswith(PREFIX) else None
    if mode == "rotate":
        if box.sealed_with_newest(stored):
            return None
        return box.seal(box.open(stored))
    if not stored.startswith(PREFIX):
        return box.seal(stored)
    box.open(stored)  # readable: kept as it is
    return None


def reseal_batch(
    conn: Connection,
    box: SecretBox,
    kind: str,
    *,
    after: str,
    limit: int,
    mode: Mode,
    packed_ids: bool = True,
) -> tuple[str | None, Resealed]:
    """Treat the next ``limit`` rows of ``kind`` after id ``after`` (``""``: from the first)
    as ``mode`` says; ``packed_ids=False`` for a schema older than migration 0023. Returns the
    last id looked at (``None``: done) and what was done."""
    table = (_PACKED if packed_ids else _TEXT)[kind]
    q = sa.select(table).order_by(table.c.id).limit(limit)
    rows = conn.execute(q.where(table.c.id > after) if after else q).all()
    done = Resealed()
    for row in rows:
        try:
            if kind == "endpoints":
                done.sealed[kind] += _endpoint(conn, box, table, row, mode)
            elif kind == "hooks":
                done.sealed[kind] += _hook(conn, box, table, row, mode)
            else:
                done.sealed[kind] += _step_secret(conn, box, table, row, mode)
        except SecretKeyError:
            done.unreadable.append(f"{_WHAT[kind]} {row.id}")
    return (rows[-1].id if len(rows) == limit else None), done


def _endpoint(conn: Connection, box: SecretBox, table: sa.TableClause, row: Any, mode: Mode) -> int:
    secret = _next(box, row.secret, mode)
    previous = _next(box, row.previous_secret, mode)
    if secret is None and previous is None:
        return 0
    c = table.c
    changed = conn.execute(
        sa.update(table)
        .where(
            c.id == row.id,
            c.secret == row.secret,
            c.previous_secret.is_not_distinct_from(row.previous_secret),
        )
        .values(secret=secret or row.secret, previous_secret=previous or row.previous_secret)
    )
    return (int(secret is not None) + int(previous is not None)) * changed.rowcount


def _hook(conn: Connection, box: SecretBox, table: sa.TableClause, row: Any, mode: Mode) -> int:
    verify = row.verify
    if not isinstance(verify, dict) or not isinstance(verify.get("secret"), str):
        return 0
    secret = _next(box, verify["secret"], mode)
    if secret is None:
        return 0
    conn.execute(
        sa.update(table).where(table.c.id == row.id).values(verify={**verify, "secret": secret})
    )
    return 1


def _step_secret(
    conn: Connection, box: SecretBox, table: sa.TableClause, row: Any, mode: Mode
) -> int:
    value = _next(box, row.value, mode)
    if value is None:
        return 0
    changed = conn.execute(  # guarded: a PUT meanwhile wrote a value of its own
        sa.update(table).where(table.c.id == row.id, table.c.value == row.value).values(value=value)
    )
    return changed.rowcount


def reseal(
    conn: Connection, box: SecretBox, *, mode: Mode, batch: int = 500, packed_ids: bool = True
) -> Resealed:
    """Every secret, in one transaction (the migration and the check on start)."""
    total = Resealed()
    for kind in KINDS if packed_ids else _BEFORE_0023:
        after: str | None = ""
        while after is not None:
            after, done = reseal_batch(
                conn, box, kind, after=after, limit=batch, mode=mode, packed_ids=packed_ids
            )
            total.add(kind, done)
    return total


async def reseal_in_batches(
    db: Database, box: SecretBox, *, mode: Mode, batch: int = 500
) -> Resealed:
    """Every secret, a transaction a batch (``flowhook secrets rotate`` on a live database)."""
    total = Resealed()
    for kind in KINDS:
        after: str | None = ""
        while after is not None:
            async with db.transaction() as conn:
                after, done = await conn.run_sync(
                    reseal_batch, box, kind, after=after, limit=batch, mode=mode
                )
            total.add(kind, done)
    return total
