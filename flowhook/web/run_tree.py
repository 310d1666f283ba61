"""What the run page draws, built from the run's records alone (no database, no HTTP): its
steps as a tree (a ``parallel`` step's branches, a ``map`` step's items, nested steps under
theirs), each step's timing bar, the status each step shows, and which approvals the page
may decide."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from flowhook.store.models import Run, RunStatus, RunStep, StepStatus

__all__ = [
    "Bar",
    "Node",
    "Group",
    "RunView",
    "run_view",
    "timeline",
    "tree",
    "decidable",
    "between_steps",
    "UNSETTLED",
]

Bar = tuple[float, float]
"""Where a step's bar starts and how wide it is, in percent of the run's time so far."""

UNSETTLED = frozenset({StepStatus.WAITING, StepStatus.RUNNING, StepStatus.RETRYING})
"""A step record in these is under way (or was, when what held it ended)."""

NOT_STARTED = "not started"
"""A branch or item cancelled before it ran a step."""

_ENDED = frozenset({*(str(s) for s in RunStatus if s.terminal), NOT_STARTED})


@dataclass
class Node:
    """A step on the run page with its bar and, for a ``parallel`` or ``map`` step, its
    branches or items and how many items stand how."""

    step: RunStep
    bar: Bar | None
    groups: list[Group] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    shown: str = ""
    """The status the page shows: the record's, but a step still waiting or running when
    its run (or its branch or item) ended shows how that ended (see :func:`_stopped`)."""

    def __post_init__(self) -> None:
        self.shown = self.shown or str(self.step.status)


@dataclass
class Group:
    """A branch or an item on the run page: its steps, and how it stands (see
    :func:`_item_status`)."""

    label: str
    members: list[Node] = field(default_factory=list)
    status: str = ""


@dataclass(frozen=True, slots=True)
class RunView:
    """What the run page draws of its steps."""

    tree: list[Node]
    decidable: set[str]
    """The approval steps the page offers to decide, by step id (:func:`decidable`)."""
    between_steps: bool
    """The engine is between two steps (:func:`between_steps`): the page looks again."""


def run_view(r: Run, now: datetime) -> RunView:
    """The run page's view of ``r`` at ``now`` (a running step's bar reaches ``now``)."""
    nodes = tree(r.steps, timeline(r, now), r.status if r.status.terminal else None)
    return RunView(nodes, decidable(nodes), between_steps(r))


def between_steps(r: Run) -> bool:
    """Whether the engine is between two of the run's steps: it is running and none of its
    steps is under way. A step that starts to wait (for a signal, a time, a person) has no
    event of its own, so the page, which redraws on events, looks again until one is."""
    return r.status is RunStatus.RUNNING and not any(
        s.depth == 0 and s.status in UNSETTLED for s in r.steps
    )


def timeline(r: Run, now: datetime) -> list[Bar | None]:
    """Per step record that ran in this run (in the order of ``r.steps``): where its bar
    starts and how wide it is, in percent of the run's time so far, so the page draws the
    steps as a timeline."""
    begin = r.started_at
    if begin is None:
        return [None] * len(r.steps)
    end = r.finished_at or now
    span = max((end - begin).total_seconds(), 1e-3)
    bars: list[Bar | None] = []
    for s in r.steps:
        if s.reused or s.started_at is None:
            bars.append(None)
            continue
        left = max(0.0, (s.started_at - begin).total_seconds() / span * 100)
        stop = (s.finished_at or end) - begin
        width = max(0.5, min(100 - left, stop.total_seconds() / span * 100 - left))
        bars.append((round(left, 2), round(width, 2)))
    return bars


def tree(
    steps: list[RunStep],
    bars: list[Bar | None],
    ended: RunStatus | None = None,
) -> list[Node]:
    """The run's step records (nested ones after their ``parallel`` or ``map`` step, deeper
    ones after theirs) as a tree: branches by name, items by index. ``ended``: how the run
    ended, if it has."""
    nodes = [Node(s, b) for s, b in zip(steps, bars, strict=True)]
    top: list[Node] = []
    stack: list[Node] = []
    for node in nodes:
        while stack and stack[-1].step.depth >= node.step.depth:
            stack.pop()
        if not stack:
            top.append(node)
        else:
            holder = stack[-1]
            label = _label(node.step.branch, node.step.index)
            if not holder.groups or holder.groups[-1].label != label:
                holder.groups.append(Group(label))
            holder.groups[-1].members.append(node)
        stack.append(node)
    for node in nodes:
        _settle_groups(node)
    _stopped(top, str(ended) if ended is not None else None)
    return top


def decidable(members: list[Node]) -> set[str]:
    """The ``approval`` steps the page can decide by step id: those one request waits on. A
    map whose items each wait on the same step has several; each item's request is decided
    through its own approve and reject links."""
    waiting: Counter[str] = Counter()

    def walk(nodes: list[Node]) -> None:
        for node in nodes:
            if node.step.type == "approval" and node.shown == "waiting":
                waiting[node.step.step_id] += 1
            for group in node.groups:
                walk(group.members)

    walk(members)
    return {step_id for step_id, n in waiting.items() if n == 1}


def _stopped(members: list[Node], how: str | None) -> None:
    """Steps whose record still says waiting, running or retrying although what holds them
    (the run, or their branch or item; ``how`` it ended, ``None`` while it goes on) has
    ended: the record stays as the step left it, never run on, and the page says
    ``cancelled`` when their holder was, else ``stopped``."""
    for node in members:
        if how is not None and node.step.status in UNSETTLED:
            node.shown = "cancelled" if how == "cancelled" else "stopped"
        for group in node.groups:
            _stopped(group.members, group.status if group.status in _ENDED else how)


def _label(branch: str | None, index: int | None) -> str:
    return f"branch {branch}" if branch is not None else f"item {index}"


def _settle_groups(node: Node) -> None:
    """Give each branch or item of ``node`` its status, list those that ran no step yet too
    (a map's items held back, or never started because the step ended first: they count
    in its total), and count a map's items by status."""
    ran = {g.label: g for g in node.groups}
    if node.step.parts:
        node.groups = []
        for key, status in node.step.parts:
            label = _label(key, None) if isinstance(key, str) else _label(None, key)
            group = ran.get(label) or Group(label)
            group.status = _item_status(group.members, status)
            node.groups.append(group)
    else:
        for group in node.groups:
            group.status = _item_status(group.members, None)
    if node.step.type == "map":
        for group in node.groups:
            node.counts[group.status] = node.counts.get(group.status, 0) + 1


def _item_status(members: list[Node], part: RunStatus | None) -> str:
    """How an item (or branch) stands: as its part ended (``completed``, ``failed``,
    ``cancelled``, or ``not started`` when it was cancelled before it ran a step),
    ``queued`` while it has not started; else, from its steps, failed if one failed,
    ``waiting`` if one waits, else ``running``. Without its part (``None``), completed when
    every step is."""
    if part is RunStatus.CANCELLED and not members:
        return NOT_STARTED
    if part is not None and part.terminal:
        return str(part)
    if not members:
        return "running" if part is RunStatus.RUNNING else "queued"
    statuses = {m.step.status for m in members}
    if StepStatus.FAILED in statuses:
        return "failed"
    if part is None and statuses <= {StepStatus.COMPLETED, StepStatus.SKIPPED}:
        return "completed"
    return "waiting" if StepStatus.WAITING in statuses else "running"
