"""Which steps a rerun reuses and where it starts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flowhook.errors import InvalidInput
from flowhook.service.rerun import parse_version, plan_rerun
from flowhook.store.models import Mode, Run, RunStatus, RunStep, StepStatus

NOW = datetime(2026, 11, 23, tzinfo=UTC)


def run(status: RunStatus, *records: tuple[str, StepStatus]) -> Run:
    steps = [
        RunStep(idx=i, step_id=id_, type="http", status=s, attempts=1, output={"from": id_})
        for i, (id_, s) in enumerate(records)
    ]
    return Run(
        run_id="run_1", workspace_id="ws", mode=Mode.TEST, flow_id="wf_1", flow_version=1,
        trigger="api", status=status, payload={}, queued_at=NOW, steps=steps,
    )  # fmt: skip


def spec(*ids: str) -> list[dict[str, Any]]:
    return [{"id": i, "type": "transform", "output": {}} for i in ids]


C, F, S = StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED
FAILED_AT_C = run(RunStatus.FAILED, ("a", C), ("b", C), ("c", F))


def test_by_default_a_failed_run_restarts_at_its_first_step_without_a_result() -> None:
    plan = plan_rerun(FAILED_AT_C, spec("a", "b", "c", "d"), 1, None)
    assert plan.start == 2
    assert [(s.idx, s.step_id, s.reused, s.output) for s in plan.reused] == [
        (0, "a", True, {"from": "a"}),
        (1, "b", True, {"from": "b"}),
    ]
    assert not FAILED_AT_C.steps[0].reused  # the original's records are copied, not changed


def test_a_completed_run_restarts_at_the_first_step_even_when_it_ended_early() -> None:
    ended_early = run(RunStatus.COMPLETED, ("a", C))  # an ``end`` left b and c unrun
    plan = plan_rerun(ended_early, spec("a", "b", "c"), 1, None)
    assert (plan.start, plan.reused) == (0, [])


def test_a_step_a_goto_skipped_counts_as_a_result() -> None:
    skipped = run(RunStatus.FAILED, ("a", C), ("b", S), ("c", F))
    plan = plan_rerun(skipped, spec("a", "b", "c"), 1, None)
    assert plan.start == 2 and [s.status for s in plan.reused] == [C, S]


def test_a_run_whose_steps_all_finished_reruns_only_its_output() -> None:
    output_failed = run(RunStatus.FAILED, ("a", C), ("b", C))
    assert plan_rerun(output_failed, spec("a", "b"), 1, None).start == 2


def test_from_a_named_step() -> None:
    plan = plan_rerun(FAILED_AT_C, spec("a", "b", "c"), 1, "b")
    assert plan.start == 1 and [s.step_id for s in plan.reused] == ["a"]
    assert plan_rerun(FAILED_AT_C, spec("a", "b", "c"), 1, "a").reused == []


def test_a_new_version_reuses_steps_by_id_at_their_new_place() -> None:
    # v2 put a new step ``x`` first and renamed ``c``: ``x`` has no result, so it runs
    plan = plan_rerun(FAILED_AT_C, spec("x", "a", "b", "c2"), 2, None)
    assert (plan.start, plan.reused) == (0, [])
    plan = plan_rerun(FAILED_AT_C, spec("b", "a", "c2"), 2, "c2")
    assert [(s.idx, s.step_id) for s in plan.reused] == [(0, "b"), (1, "a")]


def test_refusals_name_what_is_wrong() -> None:
    with pytest.raises(InvalidInput, match=r"from_step 'zz' is not a top-level step of version 3"):
        plan_rerun(FAILED_AT_C, spec("a", "b", "c"), 3, "zz")
    with pytest.raises(InvalidInput, match=r"step 'c' comes before 'd' and has no result"):
        plan_rerun(FAILED_AT_C, spec("a", "b", "c", "d"), 1, "d")
    with pytest.raises(InvalidInput, match=r"step 'new' comes before 'c'") as caught:
        plan_rerun(FAILED_AT_C, spec("a", "new", "c"), 2, "c")
    assert caught.value.field == "from_step"


@pytest.mark.parametrize("value", [None, "latest", 1, 42])
def test_flow_version_accepts_a_number_or_latest(value: Any) -> None:
    assert parse_version(value) == value


@pytest.mark.parametrize("value", [0, -1, "2", "newest", True, 1.0, [1]])
def test_flow_version_refuses_anything_else(value: Any) -> None:
    with pytest.raises(InvalidInput, match="flow_version must be") as caught:
        parse_version(value)
    assert caught.value.field == "flow_version"
