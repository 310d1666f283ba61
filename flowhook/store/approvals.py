"""``approval`` steps: the request a run makes, its two single-use links (only their SHA-256
is stored), and the decision, made once (DESIGN.md, "Steps that wait, branch and call")."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.models import Mode, RunStatus
from flowhook.store.rows import from_row
from flowhook.store.tables import approvals, runs

__all__ = [
    "Approval",
    "new_token",
    "token_hash",
    "insert",
    "get",
    "get_by_step",
    "nested_by_step",
    "by_token",
    "decide",
]

DECISIONS = ("approved", "rejected", "timeout")


def new_token() -> str:
    """A link's secret: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What is stored of a link's secret (the secret itself never is)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Approval:
    run_id: str
    idx: int
    workspace_id: str
    mode: Mode
    step_id: str
    message: str
    created_at: datetime
    expires_at: datetime | None = None
    decision: str | None = None
    decided_by: str | None = None
    comment: str | None = None
    decided_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at


_COLUMNS = [c for c in approvals.c if c.name not in ("approve_hash", "reject_hash")]


def _approval(row: Any) -> Approval:
    return from_row(Approval, row, {"mode": Mode})


async def insert(
    conn: AsyncConnection, approval: Approval, *, approve_hash: str, reject_hash: str
) -> None:
    row = {
        "run_id": approval.run_id, "idx": approval.idx, "workspace_id": approval.workspace_id,
        "mode": str(approval.mode), "step_id": approval.step_id, "message": approval.message,
        "created_at": approval.created_at, "expires_at": approval.expires_at,
        "approve_hash": approve_hash, "reject_hash": reject_hash,
    }  # fmt: skip
    await bulk.insert(conn, approvals, [row])


async def get(conn: AsyncConnection, run_id: str, idx: int) -> Approval | None:
    q = select(*_COLUMNS).where(approvals.c.run_id == run_id, approvals.c.idx == idx)
    row = (await conn.execute(q)).first()
    return _approval(row) if row else None


async def get_by_step(conn: AsyncConnection, run_id: str, step_id: str) -> Approval | None:
    """The latest request of a run's step ``step_id`` (a step reached again by a ``goto``
    loop asks again)."""
    q = (
        select(*_COLUMNS)
        .where(approvals.c.run_id == run_id, approvals.c.step_id == step_id)
        .order_by(approvals.c.idx.desc())
    )
    row = (await conn.execute(q)).first()
    return _approval(row) if row else None


async def nested_by_step(
    conn: AsyncConnection, run_id: str, step_id: str
) -> list[tuple[Approval, RunStatus]]:
    """The requests of step ``step_id`` inside ``run_id``'s branches and items (stored under
    their parts), oldest first, each with how its part stands."""
    q = (
        select(*_COLUMNS, runs.c.status.label("part_status"))
        .join(runs, runs.c.run_id == approvals.c.run_id)
        .where(runs.c.root_run_id == run_id, approvals.c.step_id == step_id)
        .order_by(approvals.c.created_at, approvals.c.run_id, approvals.c.idx)
    )
    return [(_approval(r), RunStatus(r.part_status)) for r in (await conn.execute(q)).all()]


async def by_token(conn: AsyncConnection, token: str) -> tuple[Approval, bool] | None:
    """The request a link's secret belongs to, and whether it is the approve link."""
    digest = token_hash(token)
    q = select(*_COLUMNS, approvals.c.approve_hash).where(
        or_(approvals.c.approve_hash == digest, approvals.c.reject_hash == digest)
    )
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    return _approval(row), secrets.compare_digest(row.approve_hash, digest)


async def decide(
    conn: AsyncConnection,
    approval: Approval,
    decision: str,
    *,
    by: str,
    comment: str | None,
    now: datetime,
    before_expiry: bool = True,
) -> bool:
    """Record ``decision`` unless one was made already (or, ``before_expiry``, the request
    has expired); whether it was recorded."""
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {DECISIONS}")
    q = update(approvals).where(
        approvals.c.run_id == approval.run_id,
        approvals.c.idx == approval.idx,
        approvals.c.decision.is_(None),
    )
    if before_expiry:
        q = q.where(or_(approvals.c.expires_at.is_(None), approvals.c.expires_at > now))
    result = await conn.execute(
        q.values(decision=decision, decided_by=by, comment=comment, decided_at=now)
    )
    return result.rowcount == 1
