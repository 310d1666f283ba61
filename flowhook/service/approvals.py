"""Deciding ``approval`` steps: by their single-use links (the link is the credential), with
a key through the API, or from the run page. A decision is made once; the run is woken in
the same transaction."""

from __future__ import annotations

from dataclasses import dataclass, replace

from flowhook.clock import Clock
from flowhook.errors import Conflict, InvalidInput, NotFound
from flowhook.ids import is_id
from flowhook.service.auth import Principal
from flowhook.service.lookup import missing
from flowhook.store import approvals as store
from flowhook.store import runs as runs_store
from flowhook.store import signals as signals_store
from flowhook.store.approvals import Approval
from flowhook.store.db import Connection, Database

__all__ = ["ApprovalService", "LinkView", "MAX_COMMENT"]

MAX_COMMENT = 2000


@dataclass(frozen=True, slots=True)
class LinkView:
    """What a link's page shows: the request, which decision the link makes, and whether it
    can still make it."""

    approval: Approval
    approve: bool
    open: bool
    flow_id: str


def _comment(comment: str | None) -> str | None:
    if comment is None:
        return None
    comment = comment.strip()
    if len(comment) > MAX_COMMENT:
        raise InvalidInput(f"comment must be at most {MAX_COMMENT} characters", field="comment")
    return comment or None


async def _nested(conn: Connection, run_id: str, step_id: str) -> Approval | None:
    """A request of step ``step_id`` inside the run's branches or items: the one waiting for
    a decision, else the latest (which answers that it was decided, or its part ended).
    When several wait (the step of a ``map``'s items), a key cannot say which item it
    decides: 409, decide each through the links of its ``flow.approval_requested``."""
    found = await store.nested_by_step(conn, run_id, step_id)
    waiting = [a for a, part in found if a.decision is None and not part.terminal]
    if len(waiting) > 1:
        raise Conflict(
            f"step {step_id!r} waits for a decision in {len(waiting)} items of run "
            f"{run_id!r}: decide each through the links of its flow.approval_requested event",
            code="ambiguous_step",
        )
    if waiting:
        return waiting[0]
    return found[-1][0] if found else None


class ApprovalService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def view_link(self, token: str) -> LinkView | None:
        """The request behind a link, for its confirmation page (which decides nothing);
        ``None`` for a link that does not exist."""
        if not 20 <= len(token) <= 100:
            return None
        async with self._db.read() as conn:
            found = await store.by_token(conn, token)
            if found is None:
                return None
            approval, approve = found
            run = await runs_store.get_run_by_id(conn, approval.run_id)
        live = run is not None and not run.status.terminal
        is_open = live and approval.decision is None and not approval.expired(self._clock.now())
        if run is not None and run.root_run_id is not None:  # a branch's or item's step
            approval = replace(approval, run_id=run.root_run_id)
        return LinkView(approval, approve, is_open, run.flow_id if run else "")

    async def decide_by_link(self, token: str, comment: str | None) -> Approval:
        """Decide as the link says (approve or reject); 404 for an unknown link, 409 once
        decided, expired, or the run has ended."""
        comment = _comment(comment)
        async with self._db.transaction() as conn:
            found = await store.by_token(conn, token) if 20 <= len(token) <= 100 else None
            if found is None:
                raise NotFound("this approval link does not exist")
            approval, approve = found
            return await self._decide(conn, approval, approve, "link", comment)

    async def decide(
        self,
        who: Principal,
        run_id: str,
        step_id: str,
        *,
        approve: bool,
        comment: str | None,
        by: str,
    ) -> Approval:
        """Decide a run's ``approval`` step with a key (API) or a session (run page)."""
        comment = _comment(comment)
        if not is_id(run_id, "run"):
            raise missing("run", run_id)
        async with self._db.transaction() as conn:
            run = await runs_store.get_run(conn, who.workspace_id, who.mode, run_id)
            if run is None:
                raise missing("run", run_id)
            approval = await store.get_by_step(conn, run_id, step_id)
            if approval is None:
                approval = await _nested(conn, run_id, step_id)
            if approval is None:
                raise missing("approval request", f"{run_id}/{step_id}")
            return await self._decide(conn, approval, approve, by, comment)

    async def _decide(
        self, conn: Connection, approval: Approval, approve: bool, by: str, comment: str | None
    ) -> Approval:
        now = self._clock.now()
        run = await runs_store.get_run_by_id(conn, approval.run_id)
        if run is None or run.status.terminal:
            raise Conflict("the run has already ended: nothing to decide", code="run_finished")
        if approval.decision is not None:
            raise Conflict(
                f"step {approval.step_id!r} was already decided ({approval.decision} by "
                f"{approval.decided_by})",
                code="already_decided",
            )
        decision = "approved" if approve else "rejected"
        if not await store.decide(conn, approval, decision, by=by, comment=comment, now=now):
            current = await store.get(conn, approval.run_id, approval.idx)
            if current is not None and current.decision is not None:
                raise Conflict(
                    f"step {approval.step_id!r} was already decided ({current.decision})",
                    code="already_decided",
                )
            raise Conflict("this approval request has expired", code="expired")
        await signals_store.wake(conn, [approval.run_id], now)
        decided = await store.get(conn, approval.run_id, approval.idx) or approval
        # a branch's or item's step: people know the run, not its part
        return replace(decided, run_id=run.root_run_id or run.run_id)
