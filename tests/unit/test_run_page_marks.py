"""The run page's mark for a run the engine is between two steps of: the page, which draws
itself again on the run's events, looks again while it is there, because a step that starts
to wait raises no event."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from flowhook.store.models import Mode, Run, RunStatus, RunStep, StepStatus
from flowhook.web.run_tree import between_steps as _between_steps

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def run(status: RunStatus, *steps: StepStatus, depth: int = 0) -> Run:
    return Run(
        run_id="run_1", workspace_id="ws_1", mode=Mode.TEST, flow_id="wf_1", flow_version=1,
        trigger="api", status=status, payload={}, queued_at=NOW,
        steps=[RunStep(i, f"s{i}", "wait", s, 1, depth=depth) for i, s in enumerate(steps)],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("r", "between"),
    [
        (run(RunStatus.RUNNING), True),  # claimed, no step recorded yet
        (run(RunStatus.RUNNING, StepStatus.COMPLETED), True),
        (run(RunStatus.RUNNING, StepStatus.COMPLETED, StepStatus.SKIPPED), True),
        (run(RunStatus.RUNNING, StepStatus.COMPLETED, StepStatus.WAITING), False),
        (run(RunStatus.RUNNING, StepStatus.RUNNING), False),
        (run(RunStatus.RUNNING, StepStatus.RETRYING), False),
        # a parallel's or a map's inner step does not count: its parent step is the one
        (run(RunStatus.RUNNING, StepStatus.WAITING, depth=1), True),
        (run(RunStatus.QUEUED), False),  # held back or not claimed yet: an event comes
        (run(RunStatus.COMPLETED, StepStatus.COMPLETED), False),
        (run(RunStatus.FAILED, StepStatus.FAILED), False),
    ],
)
def test_a_running_run_with_no_step_under_way_is_between_steps(r: Run, between: bool) -> None:
    assert _between_steps(r) is between
