"""``python``: call a function registered with ``@flowhook.step(name)`` in a module named in
``FLOWHOOK_PLUGINS``. Sync functions run in a thread; async ones on the loop. The function
gets a :class:`flowhook.StepContext` and returns JSON-able data (the step's output)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error
from flowhook.plugins import StepContext, registered

__all__ = ["PythonStep"]


class PythonStep(StepBase, kind="python", pure=False, external=True):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._name: str = spec["function"]
        self._input = compile_value(spec.get("input"))

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        fn = registered(self._name)
        if fn is None:
            return error(
                "python",
                f"no function {self._name!r} is registered: decorate it with "
                f"@flowhook.step({self._name!r}) in a module named in FLOWHOOK_PLUGINS",
            )
        try:
            value = await evaluate(self._input, ctx)
        except ExpressionError as exc:
            return error("expression", str(exc))
        step_ctx = StepContext(
            payload=ctx["payload"],
            steps={k: v["output"] for k, v in ctx["steps"].items()},
            input=value,
            run_id=env.run_id,
            flow_id=env.flow_id,
            step_id=self.id,
            attempt=env.attempt,
        )
        try:
            if inspect.iscoroutinefunction(fn):
                result = await fn(step_ctx)
            else:
                result = await asyncio.to_thread(fn, step_ctx)
        except Exception as exc:  # noqa: BLE001 - the user's code failing is a step error
            return error("python", f"{type(exc).__name__}: {exc}")
        return Outcome(output=result)
