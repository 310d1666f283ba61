"""``wait``: the run sleeps, holding no worker, until a signal of ``signal``'s name whose data
matches every ``match`` field arrives (or one sent to the run itself), or until
``timeout_seconds`` pass (``on_timeout``: ``fail`` with error type ``wait_timeout``, or
``continue`` with output ``null``). The executor does the waiting (it needs the store); the
step evaluates what it waits for."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error

__all__ = ["WaitStep"]


class WaitStep(StepBase, kind="wait", pure=False, external=False, limited=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.signal: str = spec["signal"]
        self._match = compile_value(spec.get("match", {}))
        self.timeout_after: float | None = spec.get("timeout_seconds")
        self.on_timeout: str = spec.get("on_timeout", "fail")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """What the run waits for: ``{"signal", "match", "until"}`` with action ``signal``."""
        try:
            match = await evaluate(self._match, ctx)
        except ExpressionError as exc:
            return error("expression", f"match: {exc}")
        if not isinstance(match, dict):
            return error("expression", "match must evaluate to an object")
        now = env.clock.now()
        until = None if self.timeout_after is None else now + timedelta(seconds=self.timeout_after)
        output = {
            "signal": self.signal,
            "match": match,
            "until": isoformat(until) if until is not None else None,
        }
        return Outcome(output=output, action="signal", wait_until=until)
