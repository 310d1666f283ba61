"""How a run's records and its parts' records are put in one list (the run record's
``steps``) and drawn as a tree on the run page."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flowhook.store.children import with_nested
from flowhook.store.models import Mode, Run, RunStatus, RunStep, StepStatus
from flowhook.web.run_tree import decidable as _decidable
from flowhook.web.run_tree import tree as _tree

NOW = datetime(2026, 11, 24, tzinfo=UTC)


def step(idx: int, sid: str, kind: str = "transform") -> RunStep:
    return RunStep(idx=idx, step_id=sid, type=kind, status=StepStatus.COMPLETED, attempts=1)


def part(run_id: str, parent: str, idx: int, **scope: Any) -> Run:
    return Run(
        run_id=run_id, workspace_id="ws", mode=Mode.TEST, flow_id="wf", flow_version=1,
        trigger="part", status=RunStatus.COMPLETED, payload={}, queued_at=NOW,
        parent_run_id=parent, parent_idx=idx, root_run_id="run_1", scope=scope,
    )  # fmt: skip


def test_parts_follow_their_step_in_order_with_where_they_ran() -> None:
    top = [step(0, "start"), step(1, "each", "map"), step(2, "after")]
    parts = [
        (part("part_a", "run_1", 1, step="each", index=0), [step(0, "both", "parallel")]),
        (part("part_b", "run_1", 1, step="each", index=1), [step(0, "both", "parallel")]),
        (part("part_c", "part_a", 0, step="both", branch="x"), [step(0, "x1"), step(1, "x2")]),
        (part("part_d", "part_b", 0, step="both", branch="x"), [step(0, "x1"), step(1, "x2")]),
    ]
    records = with_nested(top, parts, "run_1")
    got = [(s.step_id, s.parent, s.branch, s.index, s.depth) for s in records]
    assert got == [
        ("start", None, None, None, 0),
        ("each", None, None, None, 0),
        ("both", "each", None, 0, 1),
        ("x1", "both", "x", None, 2),
        ("x2", "both", "x", None, 2),
        ("both", "each", None, 1, 1),
        ("x1", "both", "x", None, 2),
        ("x2", "both", "x", None, 2),
        ("after", None, None, None, 0),
    ]
    tree = _tree(records, [None] * len(records))
    assert [n.step.step_id for n in tree] == ["start", "each", "after"]
    each = tree[1]
    assert [g.label for g in each.groups] == ["item 0", "item 1"]
    assert each.counts == {"completed": 2}
    [inner] = each.groups[0].members[0].groups
    assert inner.label == "branch x" and [n.step.step_id for n in inner.members] == ["x1", "x2"]
    assert inner.status == "completed"


def test_a_stopped_map_counts_every_item_those_never_started_too() -> None:
    """A map whose item 2 failed: item 0 completed, items 1 and 3 were stopped where they
    waited (their wait's record still says waiting), item 4 never started."""
    waiting = RunStep(idx=0, step_id="hold", type="wait", status=StepStatus.WAITING, attempts=1)
    failed = RunStep(idx=0, step_id="hold", type="wait", status=StepStatus.FAILED, attempts=1)
    how = [RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.CANCELLED,
           RunStatus.CANCELLED]  # fmt: skip
    ran = [[step(0, "hold")], [waiting], [failed], [waiting], []]
    parts = []
    for i, (status, steps) in enumerate(zip(how, ran, strict=True)):
        p = part(f"part_{i}", "run_1", 0, step="each", index=i)
        p.status = status
        parts.append((p, steps))
    records = with_nested([step(0, "each", "map")], parts, "run_1")
    [each] = _tree(records, [None] * len(records))
    assert [(g.label, g.status) for g in each.groups] == [
        ("item 0", "completed"), ("item 1", "cancelled"), ("item 2", "failed"),
        ("item 3", "cancelled"), ("item 4", "not started"),
    ]  # fmt: skip
    assert each.counts == {"completed": 1, "cancelled": 2, "failed": 1, "not started": 1}


def test_a_step_left_waiting_reads_as_its_holder_ended() -> None:
    """A wait whose item was cancelled reads cancelled; a wait left when the run failed
    reads stopped; one still going reads waiting."""
    waiting = RunStep(idx=0, step_id="hold", type="wait", status=StepStatus.WAITING, attempts=1)
    how = [RunStatus.CANCELLED, RunStatus.RUNNING]
    parts = []
    for i, status in enumerate(how):
        p = part(f"part_{i}", "run_1", 0, step="each", index=i)
        p.status = status
        parts.append((p, [waiting]))
    records = with_nested([step(0, "each", "map")], parts, "run_1")
    [each] = _tree(records, [None] * len(records))
    assert [g.members[0].shown for g in each.groups] == ["cancelled", "waiting"]
    [each] = _tree(records, [None] * len(records), RunStatus.FAILED)
    assert [g.members[0].shown for g in each.groups] == ["cancelled", "stopped"]
    top = [RunStep(idx=0, step_id="pause", type="delay", status=StepStatus.WAITING, attempts=1)]
    assert [n.shown for n in _tree(top, [None], RunStatus.CANCELLED)] == ["cancelled"]


def test_the_page_decides_an_approval_only_one_request_waits_on() -> None:
    """A branch's approval is decided from the page by its step id; a map whose items each
    wait on the same step is not (each item's links decide it)."""
    asks = RunStep(idx=0, step_id="ask", type="approval", status=StepStatus.WAITING, attempts=1)
    ok = RunStep(idx=0, step_id="ok", type="approval", status=StepStatus.WAITING, attempts=1)
    running = []
    for i in range(2):
        p = part(f"item_{i}", "run_1", 1, step="each", index=i)
        p.status = RunStatus.RUNNING
        running.append((p, [asks]))
    branch = part("branch_a", "run_1", 0, step="both", branch="a")
    branch.status = RunStatus.RUNNING
    top = [step(0, "both", "parallel"), step(1, "each", "map")]
    records = with_nested(top, [(branch, [ok]), *running], "run_1")
    assert _decidable(_tree(records, [None] * len(records))) == {"ok"}
