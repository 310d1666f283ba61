"""Step types, one module each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowhook.engine.steps.approval import ApprovalStep
from flowhook.engine.steps.base import Context, Outcome, Step, StepEnv
from flowhook.engine.steps.call import CallStep
from flowhook.engine.steps.condition import ConditionStep
from flowhook.engine.steps.delay import DelayStep
from flowhook.engine.steps.fail import FailStep
from flowhook.engine.steps.fan import MapStep, ParallelStep
from flowhook.engine.steps.http import HttpStep
from flowhook.engine.steps.python import PythonStep
from flowhook.engine.steps.task import TaskStep
from flowhook.engine.steps.transform import TransformStep
from flowhook.engine.steps.wait import WaitStep

__all__ = ["Context", "Outcome", "Step", "StepEnv", "build_step"]

_TYPES: dict[str, Callable[[dict[str, Any]], Step]] = {
    "transform": TransformStep,
    "condition": ConditionStep,
    "fail": FailStep,
    "http": HttpStep,
    "delay": DelayStep,
    "python": PythonStep,
    "wait": WaitStep,
    "approval": ApprovalStep,
    "flow": CallStep,
    "task": TaskStep,
}


def build_step(spec: dict[str, Any]) -> Step:
    """The step ``spec`` describes, with the steps nested in it."""
    if spec["type"] == "parallel":
        branches = {
            name: [build_step(s) for s in steps] for name, steps in spec["branches"].items()
        }
        return ParallelStep(spec, branches)
    if spec["type"] == "map":
        return MapStep(spec, [build_step(s) for s in spec["steps"]])
    return _TYPES[spec["type"]](spec)
