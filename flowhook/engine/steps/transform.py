"""``transform``: compute values. Its output is its ``output`` mapping, evaluated."""

from __future__ import annotations

from typing import Any

from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error

__all__ = ["TransformStep"]


class TransformStep(StepBase, kind="transform", pure=True, external=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._output = compile_value(spec["output"])

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        try:
            return Outcome(output=await evaluate(self._output, ctx))
        except ExpressionError as exc:
            return error("expression", str(exc))
