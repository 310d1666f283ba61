"""``parallel`` and ``map``: steps that run lists of steps side by side. Each branch of a
``parallel`` and each item of a ``map`` runs as a *part*: a row of the run queue any worker
claims, with its own durable step records, so a map is spread over every worker and a crash
resumes each part at its first unfinished step. The executor starts the parts and gathers
their outputs (it needs the store); the steps say what to start.

- ``parallel``: ``branches`` by name; output ``{name: that branch's last output}``.
- ``map``: ``items`` (an expression giving a list, or a literal list), ``concurrency``
  (default 10) parts at once, each seeing ``item`` and ``index``; output: each item's last
  output, in item order. More than ``FLOWHOOK_MAX_MAP_ITEMS`` items fail the step.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, Step, StepBase, StepEnv, error

__all__ = ["ParallelStep", "MapStep", "DEFAULT_MAP_CONCURRENCY", "DEFAULT_MAX_MAP_ITEMS"]

DEFAULT_MAP_CONCURRENCY = 10
DEFAULT_MAX_MAP_ITEMS = 1000


def _until(env: StepEnv, seconds: float | None) -> tuple[Any, str | None]:
    if seconds is None:
        return None, None
    until = env.clock.now() + timedelta(seconds=seconds)
    return until, isoformat(until)


class ParallelStep(StepBase, kind="parallel", pure=False, external=False, limited=False):
    def __init__(self, spec: dict[str, Any], branches: dict[str, list[Step]]) -> None:
        super().__init__(spec)
        self.branches = branches
        self.timeout_after: float | None = spec.get("timeout_seconds")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """The parts to start: one per branch, ``{"parts": [{"branch"}…], "until"}``."""
        until, text = _until(env, self.timeout_after)
        parts = [{"branch": name} for name in self.branches]
        return Outcome(output={"parts": parts, "until": text}, action="fan", wait_until=until)


class MapStep(StepBase, kind="map", pure=False, external=False, limited=False):
    def __init__(self, spec: dict[str, Any], steps: list[Step]) -> None:
        super().__init__(spec)
        self.steps = steps
        self._items = compile_value(spec["items"])
        self.concurrency: int = spec.get("concurrency", DEFAULT_MAP_CONCURRENCY)
        self.timeout_after: float | None = spec.get("timeout_seconds")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """The parts to start: one per item, ``{"parts": [{"index", "item"}…], "until"}``."""
        try:
            items = await evaluate(self._items, ctx)
        except ExpressionError as exc:
            return error("expression", f"items: {exc}")
        if not isinstance(items, list):
            kind = "null" if items is None else type(items).__name__
            return error("map_items", f"items must be a list, not {kind}")
        if len(items) > env.max_map_items:
            return error(
                "map_items",
                f"{len(items)} items, more than {env.max_map_items} (FLOWHOOK_MAX_MAP_ITEMS)",
            )
        until, text = _until(env, self.timeout_after)
        parts = [{"index": i, "item": item} for i, item in enumerate(items)]
        return Outcome(output={"parts": parts, "until": text}, action="fan", wait_until=until)
