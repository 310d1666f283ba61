"""Which steps a rerun reuses and where it starts (DESIGN.md, "Rerun from a step").

A rerun is a new run of the same flow whose top-level steps before ``from_step`` are not run
again: their records are copied from the run it reruns, matched by step id, so a rerun on a
newer version reuses every earlier step that kept its id. A step has a result to reuse when
it completed, or was skipped (a ``goto`` passed it), in that run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from flowhook.errors import InvalidInput
from flowhook.store.models import Run, RunStatus, RunStep, StepStatus

__all__ = ["RerunPlan", "plan_rerun", "parse_version"]

_RESULT = (StepStatus.COMPLETED, StepStatus.SKIPPED)


@dataclass(frozen=True, slots=True)
class RerunPlan:
    start: int
    """The index of the first step the rerun runs (``len(steps)`` when it only evaluates the
    flow's output)."""
    reused: list[RunStep]
    """The records of the steps before it, copied and marked ``reused``."""


def parse_version(value: Any) -> int | str | None:
    """``flow_version`` as a request gives it: absent, a version number, or ``"latest"``."""
    if value is None:
        return None
    if value == "latest":
        return "latest"
    if type(value) is int and value >= 1:
        return int(value)
    raise InvalidInput(
        f'flow_version must be a version number (1 or more) or "latest", not {value!r}',
        field="flow_version",
    )


def plan_rerun(
    original: Run, steps: Sequence[dict[str, Any]], version: int, from_step: str | None
) -> RerunPlan:
    """Where a rerun of ``original`` on a version whose top-level ``steps`` are given starts,
    and what it reuses. Without ``from_step``: the first step with no result in
    ``original`` (the first step when ``original`` completed). A ``from_step`` the version
    does not have, or a step before it with no result to reuse, is refused naming it."""
    ids = [spec["id"] for spec in steps]
    results = {s.step_id: s for s in original.steps if s.status in _RESULT}
    if from_step is None:
        if original.status is RunStatus.COMPLETED:
            start = 0
        else:
            start = next((i for i, id_ in enumerate(ids) if id_ not in results), len(ids))
    else:
        if type(from_step) is not str or from_step not in ids:
            raise InvalidInput(
                f"from_step {from_step!r} is not a top-level step of version {version} "
                f"of the flow (its steps: {', '.join(ids)})",
                field="from_step",
            )
        start = ids.index(from_step)
    reused = []
    for i, id_ in enumerate(ids[:start]):
        found = results.get(id_)
        if found is None:
            raise InvalidInput(
                f"step {id_!r} comes before {ids[start]!r} and has no result in run "
                f"{original.run_id} to reuse: rerun from {id_!r} or an earlier step",
                field="from_step",
            )
        reused.append(replace(found, idx=i, reused=True, interrupted=found.interrupted))
    return RerunPlan(start, reused)
