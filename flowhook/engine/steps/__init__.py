"""Step types, one module each."""

from __future__ import annotations

from typing import Any

from flowhook.engine.steps.base import Context, Outcome, Step
from flowhook.engine.steps.condition import ConditionStep
from flowhook.engine.steps.fail import FailStep
from flowhook.engine.steps.transform import TransformStep

__all__ = ["Context", "Outcome", "Step", "build_step", "UnsupportedStep"]


class UnsupportedStep:
    """A step type the definition format names but this engine does not run yet."""

    pure = True

    def __init__(self, spec: dict[str, Any]) -> None:
        self.id: str = spec["id"]
        self.type: str = spec["type"]

    async def run(self, ctx: Context) -> Outcome:
        return Outcome(
            error={
                "type": "unsupported_step",
                "message": f"step type {self.type!r} is not supported by this version of Flowhook",
            },
            action="fail",
        )


_TYPES: dict[str, type[TransformStep] | type[ConditionStep] | type[FailStep]] = {
    "transform": TransformStep,
    "condition": ConditionStep,
    "fail": FailStep,
}


def build_step(spec: dict[str, Any]) -> Step:
    cls = _TYPES.get(spec["type"])
    return cls(spec) if cls is not None else UnsupportedStep(spec)
