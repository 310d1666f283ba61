"""``approval``: the run asks a person and sleeps, holding no worker, until they approve or
reject (through a single-use link sent in the ``flow.approval_requested`` event, the API, or
the run page) or ``timeout_seconds`` pass. ``on_reject``: ``fail`` (error type ``rejected``)
or ``continue``; ``on_timeout``: ``fail`` (``approval_timeout``), ``approve`` or ``reject``.
The step renders the message; its durable half asks (the request, its links, the event)
and wakes the run on the decision or the request's expiry."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Action, Context, Outcome, StepBase, StepEnv, error
from flowhook.engine.steps.delay import parse_time
from flowhook.events import elapsed_ms, run_event
from flowhook.store import approvals as approvals_store
from flowhook.store.approvals import Approval, new_token, token_hash
from flowhook.store.models import RunStatus, RunStep, StepStatus

if TYPE_CHECKING:
    from flowhook.engine.durable import Attempt, Cursor
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["ApprovalStep", "ApprovalStore", "MAX_MESSAGE"]

MAX_MESSAGE = 2000


class ApprovalStore(Protocol):
    """What an ``approval`` step reads and writes of requests (:mod:`flowhook.store.approvals`)."""

    async def insert(
        self, conn: AsyncConnection, approval: Approval, *, approve_hash: str, reject_hash: str
    ) -> None: ...

    async def get(self, conn: AsyncConnection, run_id: str, idx: int) -> Approval | None: ...

    async def decide(
        self,
        conn: AsyncConnection,
        approval: Approval,
        decision: str,
        *,
        by: str,
        comment: str | None,
        now: datetime,
        before_expiry: bool = True,
    ) -> bool: ...


class ApprovalStep(StepBase, kind="approval", pure=False, external=False, limited=False):
    store: ApprovalStore = approvals_store

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._message = compile_value(spec.get("message", "Approve this run?"))
        self.timeout_after: float | None = spec.get("timeout_seconds")
        self.on_timeout: str = spec.get("on_timeout", "fail")
        self.on_reject: str = spec.get("on_reject", "fail")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """What to ask: ``{"message", "until"}``, suspending the run."""
        try:
            message = str(await evaluate(self._message, ctx))
        except ExpressionError as exc:
            return error("expression", f"message: {exc}")
        if len(message) > MAX_MESSAGE:
            return error("approval", f"message is longer than {MAX_MESSAGE} characters")
        now = env.clock.now()
        until = None if self.timeout_after is None else now + timedelta(seconds=self.timeout_after)
        output = {"message": message, "until": isoformat(until) if until else None}
        return Outcome(output=output, action=Action.SUSPEND, wait_until=until)

    async def park(self, cur: Cursor, attempt: Attempt, outcome: Outcome) -> RunStatus:
        """Make the two single-use links, raise ``flow.approval_requested`` with them, and
        sleep without a lease until a decision wakes the run or the request expires. The
        request (links hashed), the event and the step's ``waiting`` record are one commit."""
        run = cur.run
        now = cur.now()
        approve, reject = new_token(), new_token()
        until = outcome.wait_until
        message = outcome.output["message"]
        request = Approval(
            run.run_id, attempt.idx, run.workspace_id, run.mode, self.id, message, now, until
        )
        payload = {
            "step_id": self.id,
            "message": message,
            "approve_url": f"{cur.public_url}/approvals/{approve}",
            "reject_url": f"{cur.public_url}/approvals/{reject}",
            "expires_at": isoformat(until) if until else None,
        }
        about = replace(run, run_id=run.root_run_id) if run.root_run_id is not None else run
        cur.pending.events.append(run_event(about, "flow.approval_requested", payload, now))
        cur.add(attempt.waiting(outcome.output))
        wake = min(until or cur.deadline, cur.deadline)
        async with cur.transaction() as conn:
            await self.store.insert(
                conn, request, approve_hash=token_hash(approve), reject_hash=token_hash(reject)
            )
            await cur.apply_in(conn, cur.progress(wake=wake))
        cur.written()
        return RunStatus.RUNNING

    async def wake(self, cur: Cursor, prior: RunStep, now: datetime) -> RunStatus | None:
        """Decided (approved or rejected), expired (``on_timeout`` decides, recorded so a late
        click no longer counts), or woken early (it sleeps again)."""
        request = await self._decided(cur, now)
        if request is None or request.decision is None:
            until = prior.output.get("until")
            return await cur.sleep_until(
                min(parse_time(until), cur.deadline) if until else cur.deadline
            )
        output = {
            "approved": request.decision == "approved",
            "decided_by": request.decided_by,
            "comment": request.comment,
            "decided_at": isoformat(request.decided_at) if request.decided_at else None,
        }
        ended = replace(
            prior, finished_at=now, duration_ms=elapsed_ms(prior.started_at or now, now),
            output=output,
        )  # fmt: skip
        error: dict[str, Any] | None = None
        if request.decision == "timeout":
            seconds = self.timeout_after or 0
            error = {"type": "approval_timeout", "message": f"nobody decided within {seconds:g} s"}
        elif request.decision == "rejected" and self.on_reject == "fail":
            by = f" by {request.decided_by}" if request.decided_by else ""
            why = f": {request.comment}" if request.comment else ""
            error = {"type": "rejected", "message": f"rejected{by}{why}"}
        if error is not None:
            failed = replace(ended, status=StepStatus.FAILED, error=error)
            return await cur.done(self, failed, Outcome(error=error, action=Action.FAIL))
        # the decision is stored (in ``approvals``): found again after a crash
        completed = replace(ended, status=StepStatus.COMPLETED)
        return await cur.done(self, completed, Outcome(output=output), durable=True)

    async def _decided(self, cur: Cursor, now: datetime) -> Approval | None:
        """The run's request at this step, decided by ``on_timeout`` when it has expired."""
        async with cur.transaction() as conn:
            request = await self.store.get(conn, cur.run.run_id, cur.idx)
            if request is not None and request.decision is None and request.expired(now):
                on_timeout = self.on_timeout
                decision = {"approve": "approved", "reject": "rejected"}.get(on_timeout, "timeout")
                await self.store.decide(
                    conn, request, decision, by="timeout", comment=None, now=now,
                    before_expiry=False,
                )  # fmt: skip
                request = await self.store.get(conn, cur.run.run_id, cur.idx)
        return request
