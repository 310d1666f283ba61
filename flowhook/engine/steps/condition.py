"""``condition``: evaluate ``if``; go on by ``then`` when true and ``else`` when false.

Each branch is ``continue`` (the default), ``end`` (finish the run now, completed), ``fail``
(finish it failed), or the id of a later step to skip to (the steps between are skipped).
"""

from __future__ import annotations

from typing import Any

from flowhook.definition import ACTIONS, ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error

__all__ = ["ConditionStep"]


class ConditionStep(StepBase, kind="condition", pure=True, external=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._if = compile_value(spec["if"])
        self._then: str = spec.get("then", "continue")
        self._else: str = spec.get("else", "continue")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        try:
            result = bool(await evaluate(self._if, ctx))
        except ExpressionError as exc:
            return error("expression", str(exc))
        branch = self._then if result else self._else
        output = {"result": result}
        if branch == "fail":
            return Outcome(
                output=output,
                error={"type": "condition", "message": f"condition {self.id!r} was {result}"},
                action="fail",
            )
        if branch in ACTIONS:
            return Outcome(output=output, action=branch)
        return Outcome(output=output, action="goto", target=branch)
