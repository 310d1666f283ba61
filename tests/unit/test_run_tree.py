"""The run page's view-model (flowhook/web/run_tree.py), built from model objects alone: the
timing bars, the status each step shows, branches and items, and the approvals the page
offers to decide."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flowhook.store.models import Mode, Run, RunStatus, RunStep, StepStatus
from flowhook.web.run_tree import between_steps, run_view, timeline, tree

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def step(idx: int, sid: str, status: StepStatus, **fields: Any) -> RunStep:
    kind = fields.pop("type", "transform")
    return RunStep(idx=idx, step_id=sid, type=kind, status=status, attempts=1, **fields)


def run(status: RunStatus, steps: list[RunStep], **fields: Any) -> Run:
    return Run(
        run_id="run_1", workspace_id="ws_1", mode=Mode.TEST, flow_id="wf_1", flow_version=1,
        trigger="api", status=status, payload={}, queued_at=T0, steps=steps, **fields,
    )  # fmt: skip


def test_bars_are_percent_of_the_run_s_time() -> None:
    steps = [
        step(0, "a", StepStatus.COMPLETED, started_at=at(0), finished_at=at(2)),
        step(1, "b", StepStatus.COMPLETED, started_at=at(4), finished_at=at(10)),
        step(2, "tiny", StepStatus.COMPLETED, started_at=at(10), finished_at=at(10)),
        step(3, "copied", StepStatus.COMPLETED, started_at=at(0), reused=True),
        step(4, "never", StepStatus.SKIPPED),
    ]
    r = run(RunStatus.COMPLETED, steps, started_at=at(0), finished_at=at(10))
    assert timeline(r, now=at(99)) == [(0.0, 20.0), (40.0, 60.0), (100.0, 0.5), None, None]


def test_a_running_step_s_bar_reaches_now_and_a_run_not_started_has_none() -> None:
    steps = [
        step(0, "a", StepStatus.COMPLETED, started_at=at(0), finished_at=at(1)),
        step(1, "b", StepStatus.RUNNING, started_at=at(1)),
    ]
    r = run(RunStatus.RUNNING, steps, started_at=at(0))
    assert timeline(r, now=at(4)) == [(0.0, 25.0), (25.0, 75.0)]
    assert timeline(run(RunStatus.QUEUED, steps), now=at(4)) == [None, None]


def test_a_finished_run_s_page() -> None:
    steps = [step(0, "a", StepStatus.COMPLETED), step(1, "b", StepStatus.COMPLETED)]
    view = run_view(run(RunStatus.COMPLETED, steps), now=at(5))
    assert [(n.step.step_id, n.shown, n.bar, n.groups) for n in view.tree] == [
        ("a", "completed", None, []),
        ("b", "completed", None, []),
    ]
    assert view.decidable == set() and view.between_steps is False


def test_a_step_left_waiting_shows_how_its_run_ended() -> None:
    pause = [step(0, "pause", StepStatus.WAITING, type="delay")]
    assert [n.shown for n in run_view(run(RunStatus.CANCELLED, pause), at(1)).tree] == ["cancelled"]
    assert [n.shown for n in run_view(run(RunStatus.FAILED, pause), at(1)).tree] == ["stopped"]
    assert [n.shown for n in run_view(run(RunStatus.RUNNING, pause), at(1)).tree] == ["waiting"]


def test_a_waiting_approval_is_decided_from_the_page() -> None:
    steps = [step(0, "ask", StepStatus.WAITING, type="approval")]
    view = run_view(run(RunStatus.RUNNING, steps), now=at(1))
    assert view.decidable == {"ask"}
    assert view.between_steps is False  # it waits: an event comes when it is decided


def test_branches_that_ran_no_step_yet_are_listed_with_how_they_stand() -> None:
    both = step(
        0, "both", StepStatus.WAITING, type="parallel",
        parts=(("x", RunStatus.RUNNING), ("y", RunStatus.QUEUED), ("z", RunStatus.RUNNING)),
    )  # fmt: skip
    inner = step(0, "x1", StepStatus.WAITING, type="wait", depth=1, parent="both", branch="x")
    [node] = tree([both, inner], [None, None])
    assert [(g.label, g.status, len(g.members)) for g in node.groups] == [
        ("branch x", "waiting", 1),
        ("branch y", "queued", 0),
        ("branch z", "running", 0),
    ]
    assert node.counts == {}  # only a map counts its items


def test_the_engine_between_two_steps() -> None:
    done = [step(0, "a", StepStatus.COMPLETED)]
    assert between_steps(run(RunStatus.RUNNING, done)) is True
    assert between_steps(run(RunStatus.COMPLETED, done)) is False
