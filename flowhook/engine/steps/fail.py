"""``fail``: end the run as failed with ``message`` (templated)."""

from __future__ import annotations

from typing import Any

from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error

__all__ = ["FailStep"]


class FailStep(StepBase, kind="fail", pure=True, external=False, limited=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._message = compile_value(spec.get("message", f"step {spec['id']!r} failed the run"))

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        try:
            message = str(await evaluate(self._message, ctx))
        except ExpressionError as exc:
            message = str(exc)
        return error("fail", message)
