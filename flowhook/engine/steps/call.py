"""``flow``: start a child run of another flow of the same workspace and mode (trigger
``flow``, its record's ``parent_run_id`` names this run). With ``wait`` (the default) the run
sleeps, holding no worker, until the child ends: its output is the child's, and a failed or
cancelled child fails the step; ``timeout_seconds`` bounds the wait (the child is then
cancelled). ``wait: false`` goes on at once with ``{"run_id"}``. The executor starts the
child (it needs the store); the step evaluates the child's payload."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error

__all__ = ["CallStep", "MAX_DEPTH"]

MAX_DEPTH = 10
"""How deep sub-flows may nest: a run of depth 10 cannot start a child."""


class CallStep(StepBase, kind="flow", pure=False, external=False, limited=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.flow_id: str = spec["flow_id"]
        self._payload = compile_value(spec.get("payload", {}))
        self.wait: bool = spec.get("wait", True)
        self.timeout_after: float | None = spec.get("timeout_seconds")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """The child to start: ``{"flow_id", "payload", "wait", "until"}`` with action
        ``call``."""
        try:
            payload = await evaluate(self._payload, ctx)
        except ExpressionError as exc:
            return error("expression", f"payload: {exc}")
        if not isinstance(payload, dict):
            return error("expression", "payload must evaluate to an object")
        now = env.clock.now()
        until = None
        if self.wait and self.timeout_after is not None:
            until = now + timedelta(seconds=self.timeout_after)
        output = {
            "flow_id": self.flow_id,
            "payload": payload,
            "wait": self.wait,
            "until": isoformat(until) if until is not None else None,
        }
        return Outcome(output=output, action="call", wait_until=until)
