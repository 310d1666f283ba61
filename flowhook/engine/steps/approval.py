"""``approval``: the run asks a person and sleeps, holding no worker, until they approve or
reject (through a single-use link sent in the ``flow.approval_requested`` event, the API, or
the run page) or ``timeout_seconds`` pass. ``on_reject``: ``fail`` (error type ``rejected``)
or ``continue``; ``on_timeout``: ``fail`` (``approval_timeout``), ``approve`` or ``reject``.
The executor does the asking and the waiting; the step renders the message."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error

__all__ = ["ApprovalStep"]

MAX_MESSAGE = 2000


class ApprovalStep(StepBase, kind="approval", pure=False, external=False, limited=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._message = compile_value(spec.get("message", "Approve this run?"))
        self.timeout_after: float | None = spec.get("timeout_seconds")
        self.on_timeout: str = spec.get("on_timeout", "fail")
        self.on_reject: str = spec.get("on_reject", "fail")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """What to ask: ``{"message", "until"}`` with action ``approval``."""
        try:
            message = str(await evaluate(self._message, ctx))
        except ExpressionError as exc:
            return error("expression", f"message: {exc}")
        if len(message) > MAX_MESSAGE:
            return error("approval", f"message is longer than {MAX_MESSAGE} characters")
        now = env.clock.now()
        until = None if self.timeout_after is None else now + timedelta(seconds=self.timeout_after)
        output = {"message": message, "until": isoformat(until) if until else None}
        return Outcome(output=output, action="approval", wait_until=until)
