"""``condition``: evaluate ``if``; go on by ``then`` when true and ``else`` when false.

Each branch is ``continue`` (the default), ``end`` (finish the run now, completed), ``fail``
(finish it failed), or the id of a later step to skip to (the steps between are skipped).
"""

from __future__ import annotations

from typing import Any

from flowhook.definition import ACTIONS, ExpressionError, compile_value, evaluate
from flowhook.definition.explain import show_reads
from flowhook.definition.expressions import read_paths
from flowhook.engine.steps.base import Action, Context, Outcome, StepBase, StepEnv, error

__all__ = ["ConditionStep"]


class ConditionStep(StepBase, kind="condition", pure=True, external=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._if = compile_value(spec["if"])
        self._reads = read_paths(spec["if"]) if isinstance(spec["if"], str) else ()
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
            said = f"condition {self.id!r} was {'true' if result else 'false'}"
            if reads := show_reads(self._reads, ctx):
                said += f": {reads}"
            return Outcome(
                output=output, error={"type": "condition", "message": said}, action=Action.FAIL
            )
        if branch in ACTIONS:
            return Outcome(output=output, action=Action(branch))
        return Outcome(output=output, action=Action.GOTO, target=branch)
