"""Each step type that suspends its run owns its durable half (``park`` and ``wake``,
flowhook.engine.durable): driven here against a fake cursor and a fake store, with no
database and no clock. The integration and e2e tests run the same halves on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowhook.engine.cursor import Pending
from flowhook.engine.durable import Attempt, Cursor, Suspending, check_output
from flowhook.engine.steps import Outcome, build_step
from flowhook.engine.steps.approval import ApprovalStep
from flowhook.engine.steps.base import Action, Step
from flowhook.engine.steps.call import MAX_DEPTH, CallStep
from flowhook.engine.steps.fan import MapStep, ParallelStep
from flowhook.engine.steps.task import TaskStep
from flowhook.engine.steps.wait import WaitStep
from flowhook.store.approvals import Approval
from flowhook.store.models import Event, Flow, Mode, Run, RunStatus, RunStep, StepStatus
from flowhook.store.runs import Progress, StatusChange
from flowhook.store.signals import Signal, Wait
from flowhook.store.tasks import Task

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
HOUR = timedelta(hours=1)
CONN: Any = object()
"""What the fake cursor's transactions hand out: the fake stores never look at it."""


def a_run(**kw: Any) -> Run:
    fields: dict[str, Any] = {
        "run_id": "run_1", "workspace_id": "ws", "mode": Mode.TEST, "flow_id": "wf_1",
        "flow_version": 1, "trigger": "api", "status": RunStatus.RUNNING, "payload": {},
        "queued_at": T0 - HOUR, "started_at": T0,
    }  # fmt: skip
    return Run(**{**fields, **kw})


@dataclass
class FakeCursor:
    """A :class:`~flowhook.engine.durable.Cursor` that records what a step asks of it."""

    run: Run = field(default_factory=a_run)
    idx: int = 0
    at: datetime = T0
    deadline: datetime = T0 + HOUR
    ctx: dict[str, Any] = field(default_factory=lambda: {"payload": {}, "steps": {}})
    pending: Pending = field(default_factory=Pending)
    applied: list[Progress] = field(default_factory=list)
    slept: list[datetime] = field(default_factory=list)
    ended: list[tuple[RunStep, Outcome, bool]] = field(default_factory=list)
    recorded: list[RunStep] = field(default_factory=list)
    branches_seen: list[int] = field(default_factory=list)
    transactions: int = 0

    @property
    def timeout(self) -> float:
        return 3600.0

    @property
    def public_url(self) -> str:
        return "https://flowhook.example"

    @property
    def max_run_tree(self) -> int:
        return 100

    def now(self) -> datetime:
        return self.at

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Any]:
        yield CONN

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        self.transactions += 1
        yield CONN

    def add(self, record: RunStep) -> None:
        self.pending.steps.append(record)

    def record(self, record: RunStep) -> None:
        self.recorded.append(record)
        self.pending.steps.append(record)

    def progress(self, *, wake: datetime | None = None) -> Progress:
        values: dict[str, Any] = {"next_step": self.idx}
        if wake is not None:
            values["available_at"] = wake
        change = StatusChange(RunStatus.RUNNING, values)
        return Progress(
            self.run.run_id, (change,), list(self.pending.steps), list(self.pending.events)
        )

    async def apply(self, progress: Progress) -> None:
        if progress.before is not None:
            await progress.before(CONN)
        self.applied.append(progress)
        if progress.after is not None:  # the write applied
            await progress.after(CONN)

    async def apply_in(self, conn: Any, progress: Progress) -> None:
        assert conn is CONN
        self.applied.append(progress)

    def written(self) -> None:
        self.pending = Pending()

    async def sleep_until(self, wake: datetime) -> RunStatus:
        self.slept.append(wake)
        return RunStatus.RUNNING

    async def done(
        self, step: Step, record: RunStep, outcome: Outcome, *, durable: bool = False
    ) -> RunStatus | None:
        self.ended.append((record, outcome, durable))
        self.idx += 1
        return RunStatus.FAILED if outcome.action == Action.FAIL else None

    async def failed(self, attempt: Attempt, type_: str, message: str) -> RunStatus | None:
        outcome = Outcome(error={"type": type_, "message": message}, action=Action.FAIL)
        return await self.done(
            attempt.step, attempt.record(StepStatus.FAILED, self.at, outcome), outcome
        )

    def check_output(self, outcome: Outcome) -> None:
        check_output(outcome, 1000)

    def step_event(self, step: RunStep, *, will_retry: bool) -> Event:
        from flowhook.events import run_event

        payload = {"step_id": step.step_id, "error": step.error, "will_retry": will_retry}
        kind = "flow.step_failed" if step.error is not None else "flow.step_completed"
        return run_event(self.run, kind, payload, self.at)

    def under_step(self, attempt: Attempt) -> str:
        return "00-trace-span-01"

    async def see_branches(self, idx: int) -> None:
        self.branches_seen.append(idx)


def fake(cur: FakeCursor) -> Cursor:
    return cur  # type-checks the fake against the protocol


async def reached(step: Step, cur: FakeCursor) -> tuple[Attempt, Outcome]:
    """The step's attempt, as the loop makes it, and its outcome (suspending the run)."""
    from flowhook.engine.steps import StepEnv

    class Clock:
        def now(self) -> datetime:
            return cur.at

    env = StepEnv(Clock(), None, False, cur.run.run_id, cur.run.flow_id, 1)  # type: ignore[arg-type]
    outcome = await step.run(cur.ctx, env)
    assert outcome.action == Action.SUSPEND, outcome
    assert isinstance(step, Suspending)
    return Attempt(step, cur.idx, 1, (), cur.at), outcome


def waiting(cur: FakeCursor) -> RunStep:
    [record] = [s for p in cur.applied for s in p.steps if s.status is StepStatus.WAITING]
    return record


# -- delay ---------------------------------------------------------------------------------


async def test_delay_sleeps_until_its_time_then_completes() -> None:
    step = build_step({"id": "nap", "type": "delay", "seconds": 60})
    cur = FakeCursor()
    attempt, outcome = await reached(step, cur)
    assert isinstance(step, Suspending)
    assert await step.park(fake(cur), attempt, outcome) is RunStatus.RUNNING
    assert cur.slept == [T0 + timedelta(seconds=60)]
    [record] = cur.pending.steps
    assert record.status is StepStatus.WAITING and record.output["until"]

    early = FakeCursor(at=T0 + timedelta(seconds=30))
    assert await step.wake(fake(early), record, early.at) is RunStatus.RUNNING
    assert early.slept == [T0 + timedelta(seconds=60)] and early.ended == []

    late = FakeCursor(at=T0 + timedelta(seconds=61))
    assert await step.wake(fake(late), record, late.at) is None
    [(done, _, durable)] = late.ended
    assert done.status is StepStatus.COMPLETED and done.duration_ms == 61_000 and durable


async def test_a_delay_past_the_run_s_deadline_sleeps_only_until_the_deadline() -> None:
    step = build_step({"id": "nap", "type": "delay", "seconds": 7200})
    cur = FakeCursor()
    attempt, outcome = await reached(step, cur)
    assert isinstance(step, Suspending)
    await step.park(fake(cur), attempt, outcome)
    assert cur.slept == [cur.deadline]


# -- wait ----------------------------------------------------------------------------------


@dataclass
class FakeSignals:
    waiting_for: Signal | None = None
    """What ``find_for_wait`` finds (a signal sent before the run reached the step)."""
    resolved: tuple[bool, Signal | None] = (False, None)
    registered: list[tuple[Wait, Signal | None]] = field(default_factory=list)
    locked: list[str] = field(default_factory=list)
    taken_by: Signal | None = None

    async def lock_name(self, conn: Any, workspace_id: str, mode: str, name: str) -> None:
        self.locked.append(name)

    async def find_for_wait(self, conn: Any, wait: Wait, since: datetime) -> Signal | None:
        return self.waiting_for

    async def register_wait(
        self, conn: Any, wait: Wait, *, resolved_by: Signal | None = None, now: datetime
    ) -> None:
        self.registered.append((wait, resolved_by))

    async def taken(self, conn: Any, run_id: str, idx: int) -> Signal | None:
        return self.taken_by

    async def resolve_wait(
        self, conn: Any, run_id: str, idx: int, now: datetime
    ) -> tuple[bool, Signal | None]:
        return self.resolved


PAID = Signal("sig_1", "ws", Mode.TEST, "order.paid", {"order": 7}, T0 - timedelta(minutes=5))


def a_wait(store: FakeSignals, **spec: Any) -> WaitStep:
    step = build_step({"id": "paid", "type": "wait", "signal": "order.paid", **spec})
    assert isinstance(step, WaitStep)
    step.store = store
    return step


async def test_wait_parks_the_run_registering_the_wait_under_the_name_s_lock() -> None:
    store = FakeSignals()
    step = a_wait(store, match={"order": "{{ payload.order }}"}, timeout_seconds=600)
    cur = FakeCursor(ctx={"payload": {"order": 7}, "steps": {}})
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is RunStatus.RUNNING
    [progress] = cur.applied
    assert progress.lock_key == "signal:ws:test:order.paid"
    assert progress.changes[0].values["available_at"] == T0 + timedelta(seconds=600)
    assert waiting(cur).output["match"] == {"order": 7}
    assert store.locked == ["order.paid"]
    [(wait, by)] = store.registered
    assert (wait.run_id, wait.name, wait.match, by) == ("run_1", "order.paid", {"order": 7}, None)
    assert cur.pending.steps == []  # written


async def test_wait_goes_on_at_once_with_a_signal_sent_before() -> None:
    store = FakeSignals(waiting_for=PAID)
    step = a_wait(store)
    cur = FakeCursor()
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is None
    [(record, out, durable)] = cur.ended
    assert record.status is StepStatus.COMPLETED and durable
    assert out.output == {
        "signal": "order.paid", "id": "sig_1", "data": {"order": 7},
        "received_at": "2026-01-02T02:59:05.000Z",
    }  # fmt: skip
    assert store.registered[0][1] is PAID  # counted as used by this run


@pytest.mark.parametrize(
    ("resolved", "taken", "on_timeout", "expected"),
    [
        ((False, None), None, "fail", "sleeps"),
        ((True, PAID), None, "fail", "signalled"),
        ((False, None), PAID, "fail", "signalled"),  # found by a read, no lock
        ((True, None), None, "fail", "wait_timeout"),
        ((True, None), None, "continue", "continued"),
    ],
)
async def test_wait_wakes_by_its_signal_or_its_time(
    resolved: tuple[bool, Signal | None], taken: Signal | None, on_timeout: str, expected: str
) -> None:
    store = FakeSignals(resolved=resolved, taken_by=taken)
    step = a_wait(store, timeout_seconds=60, on_timeout=on_timeout)
    until = T0 + timedelta(seconds=60)
    prior = RunStep(
        idx=0, step_id="paid", type="wait", status=StepStatus.WAITING, attempts=1,
        started_at=T0, output={"signal": "order.paid", "match": {}, "until": "2026-01-02T03:05:05Z"},
    )  # fmt: skip
    cur = FakeCursor(at=T0 + timedelta(seconds=30))
    status = await step.wake(fake(cur), prior, cur.at)
    if expected == "sleeps":
        assert status is RunStatus.RUNNING and cur.slept == [until]
        return
    [(record, outcome, durable)] = cur.ended
    if expected == "signalled":
        assert record.status is StepStatus.COMPLETED and durable
        assert outcome.output["id"] == "sig_1"
        assert store.locked == ([] if taken else ["order.paid"])
    elif expected == "wait_timeout":
        assert status is RunStatus.FAILED and record.status is StepStatus.FAILED
        assert record.error == {
            "type": "wait_timeout", "message": "no signal 'order.paid' came within 60 s",
        }  # fmt: skip
    else:
        assert status is None and record.status is StepStatus.COMPLETED
        assert record.output is None and not durable


# -- approval ------------------------------------------------------------------------------


@dataclass
class FakeApprovals:
    request: Approval | None = None
    inserted: list[tuple[Approval, str, str]] = field(default_factory=list)
    decided: list[tuple[str, str]] = field(default_factory=list)

    async def insert(
        self, conn: Any, approval: Approval, *, approve_hash: str, reject_hash: str
    ) -> None:
        self.inserted.append((approval, approve_hash, reject_hash))

    async def get(self, conn: Any, run_id: str, idx: int) -> Approval | None:
        return self.request

    async def decide(
        self, conn: Any, approval: Approval, decision: str, *, by: str, comment: str | None,
        now: datetime, before_expiry: bool = True,
    ) -> bool:  # fmt: skip
        self.decided.append((decision, by))
        assert self.request is not None
        self.request = replace(self.request, decision=decision, decided_by=by, decided_at=now)
        return True


def an_approval(store: FakeApprovals, **spec: Any) -> ApprovalStep:
    step = build_step({"id": "ok", "type": "approval", "message": "Ship it?", **spec})
    assert isinstance(step, ApprovalStep)
    step.store = store
    return step


ASKED = RunStep(
    idx=0, step_id="ok", type="approval", status=StepStatus.WAITING, attempts=1, started_at=T0,
    output={"message": "Ship it?", "until": "2026-01-02T04:04:05Z"},
)  # fmt: skip


async def test_approval_asks_with_two_links_stored_hashed_in_one_commit() -> None:
    store = FakeApprovals()
    step = an_approval(store, timeout_seconds=3600)
    cur = FakeCursor()
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is RunStatus.RUNNING
    assert cur.transactions == 1
    [(request, approve_hash, reject_hash)] = store.inserted
    assert request.message == "Ship it?" and request.expires_at == T0 + HOUR
    [progress] = cur.applied
    [event] = progress.events
    assert isinstance(event, Event) and event.type == "flow.approval_requested"
    body = event.payload.decode()
    assert "https://flowhook.example/approvals/" in body
    assert approve_hash not in body and reject_hash not in body  # only the hashes are kept
    assert waiting(cur).output["message"] == "Ship it?"


@pytest.mark.parametrize(
    ("decision", "on_reject", "on_timeout", "status", "error"),
    [
        (None, "fail", "fail", "sleeps", None),
        ("approved", "fail", "fail", StepStatus.COMPLETED, None),
        ("rejected", "continue", "fail", StepStatus.COMPLETED, None),
        ("rejected", "fail", "fail", StepStatus.FAILED, "rejected by ana: too big"),
        ("expired", "fail", "fail", StepStatus.FAILED, "nobody decided within 3600 s"),
        ("expired", "fail", "approve", StepStatus.COMPLETED, None),
    ],
)
async def test_approval_wakes_on_the_decision_or_its_expiry(
    decision: str | None, on_reject: str, on_timeout: str, status: Any, error: str | None
) -> None:
    request = Approval("run_1", 0, "ws", Mode.TEST, "ok", "Ship it?", T0, T0 + HOUR)
    now = T0 + timedelta(minutes=10)
    if decision == "expired":
        now = T0 + 2 * HOUR
    elif decision is not None:
        request = replace(request, decision=decision, decided_by="ana", comment="too big",
                          decided_at=now)  # fmt: skip
    store = FakeApprovals(request=request)
    step = an_approval(store, timeout_seconds=3600, on_reject=on_reject, on_timeout=on_timeout)
    cur = FakeCursor(at=now, deadline=T0 + 3 * HOUR)
    result = await step.wake(fake(cur), ASKED, now)
    if status == "sleeps":
        assert result is RunStatus.RUNNING and cur.slept == [T0 + HOUR] and cur.ended == []
        return
    [(record, outcome, durable)] = cur.ended
    assert record.status is status
    if error is None:
        assert durable and outcome.output["approved"] == (decision != "rejected")
    else:
        assert record.error is not None and record.error["message"] == error
    if decision == "expired":
        assert store.decided == [("approved" if on_timeout == "approve" else "timeout", "timeout")]


# -- flow (sub-flow) -----------------------------------------------------------------------


@dataclass
class FakeRuns:
    flow: Flow | None = None
    refused: str | None = None
    child: Run | None = None
    parts: list[Run] = field(default_factory=list)
    inserted: list[Run] = field(default_factory=list)
    released: int | None = None
    stopped: list[tuple[str, int | None]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    async def get_flow(self, conn: Any, workspace_id: str, mode: Mode, flow_id: str) -> Flow | None:
        return self.flow

    async def take_child(self, conn: Any, tree_run_id: str, budget: int) -> str | None:
        return self.refused

    async def insert_run(self, conn: Any, run: Run) -> None:
        self.inserted.append(run)

    async def insert_parts(self, conn: Any, parts: Sequence[Run], *, released: int) -> None:
        self.inserted += parts
        self.released = released

    async def lock_parent(self, conn: Any, parent_run_id: str) -> None:
        pass

    async def child_at(self, conn: Any, parent_run_id: str, idx: int) -> Run | None:
        return self.child

    async def parts_at(self, conn: Any, parent_run_id: str, idx: int) -> list[Run]:
        return self.parts

    async def stop(
        self, conn: Any, run_id: str, now: datetime, *, idx: int | None = None
    ) -> list[Run]:
        self.stopped.append((run_id, idx))
        return [r for r in [self.child, *self.parts] if r is not None]

    async def insert_events(self, conn: Any, events: Sequence[Event]) -> None:
        self.events += events


FLOW = Flow(flow_id="wf_2", workspace_id="ws", mode=Mode.TEST, name="child", version=4,
            definition={}, created_at=T0, updated_at=T0, archived_at=None)  # fmt: skip


def a_call(store: FakeRuns, **spec: Any) -> CallStep:
    step = build_step({"id": "sub", "type": "flow", "flow_id": "wf_2", "payload": {"a": 1}, **spec})
    assert isinstance(step, CallStep)
    step.store = store
    return step


@pytest.mark.parametrize(
    ("store", "run", "error"),
    [
        (FakeRuns(flow=FLOW), a_run(scope={"depth": MAX_DEPTH}), "flow_depth"),
        (FakeRuns(), a_run(), "flow_not_found"),
        (FakeRuns(flow=FLOW, refused="budget"), a_run(), "run_tree_exhausted"),
        (FakeRuns(flow=FLOW, refused="cancelled"), a_run(), "run_tree_cancelled"),
    ],
)
async def test_a_flow_step_that_may_not_start_its_child_fails(
    store: FakeRuns, run: Run, error: str
) -> None:
    step = a_call(store)
    cur = FakeCursor(run=run)
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is RunStatus.FAILED
    [(record, _, _)] = cur.ended
    assert record.error is not None and record.error["type"] == error
    assert store.inserted == [] and cur.applied == []


async def test_a_flow_step_starts_its_child_and_sleeps_in_one_commit() -> None:
    store = FakeRuns(flow=FLOW)
    step = a_call(store, timeout_seconds=300)
    cur = FakeCursor(idx=2)
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is RunStatus.RUNNING
    [child] = store.inserted
    assert (child.flow_id, child.flow_version, child.payload) == ("wf_2", 4, {"a": 1})
    assert (child.parent_run_id, child.parent_idx, child.trigger) == ("run_1", 2, "flow")
    assert child.scope == {"depth": 1, "caller": "run_1", "tree": "run_1"}
    assert waiting(cur).output["run_id"] == child.run_id
    assert cur.applied[0].changes[0].values["available_at"] == T0 + timedelta(seconds=300)


async def test_a_flow_step_without_wait_goes_on_with_the_child_s_id() -> None:
    store = FakeRuns(flow=FLOW)
    step = a_call(store, wait=False)
    cur = FakeCursor()
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is None
    [child] = store.inserted
    [record] = cur.recorded
    assert record.status is StepStatus.COMPLETED and record.output == {"run_id": child.run_id}
    assert cur.idx == 1 and len(cur.applied) == 1  # recorded in the child's commit


@pytest.mark.parametrize(
    ("child", "at", "expected"),
    [
        (RunStatus.RUNNING, T0 + timedelta(seconds=10), "sleeps"),
        (RunStatus.RUNNING, T0 + timedelta(seconds=400), "timeout"),
        (RunStatus.COMPLETED, T0 + timedelta(seconds=10), "completed"),
        (RunStatus.FAILED, T0 + timedelta(seconds=10), "child_failed"),
        (RunStatus.CANCELLED, T0 + timedelta(seconds=10), "child_cancelled"),
        (None, T0 + timedelta(seconds=10), "child_failed"),
    ],
)
async def test_a_flow_step_wakes_when_its_child_ends(
    child: RunStatus | None, at: datetime, expected: str
) -> None:
    run = None if child is None else a_run(run_id="run_2", status=child, output={"b": 2},
                                          error={"message": "boom"})  # fmt: skip
    store = FakeRuns(child=run)
    step = a_call(store, timeout_seconds=300)
    prior = RunStep(
        idx=0, step_id="sub", type="flow", status=StepStatus.WAITING, attempts=1, started_at=T0,
        output={"run_id": "run_2", "flow_id": "wf_2", "until": "2026-01-02T03:09:05Z"},
    )  # fmt: skip
    cur = FakeCursor(at=at)
    status = await step.wake(fake(cur), prior, at)
    if expected == "sleeps":
        assert status is RunStatus.RUNNING and cur.ended == []
        assert cur.applied[0].changes[0].values["available_at"] == T0 + timedelta(seconds=300)
        return
    [(record, _, durable)] = cur.ended
    if expected == "completed":
        assert record.status is StepStatus.COMPLETED and record.output == {"b": 2} and durable
        return
    assert status is RunStatus.FAILED and record.error is not None
    assert record.error["type"] == expected and record.error["run_id"] == "run_2"
    if expected == "timeout":  # the child is cancelled with the step, its event raised
        assert store.stopped == [("run_1", None)]
        assert [e.type for e in store.events] == ["flow.cancelled"]


# -- parallel and map ----------------------------------------------------------------------


def a_part(i: int, status: RunStatus, **scope: Any) -> Run:
    return a_run(run_id=f"part_{i}", status=status, output={"n": i}, scope=scope, steps_executed=2)


async def test_a_map_queues_its_items_as_parts_with_its_concurrency() -> None:
    store = FakeRuns()
    step = build_step({"id": "each", "type": "map", "items": "{{ payload.xs }}", "concurrency": 2,
                       "steps": [{"id": "t", "type": "transform", "output": "{{ item }}"}]})  # fmt: skip
    assert isinstance(step, MapStep)
    step.store = store
    cur = FakeCursor(ctx={"payload": {"xs": ["a", "b", "c"]}, "steps": {}})
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is RunStatus.RUNNING
    assert store.released == 2
    assert [p.scope for p in store.inserted] == [
        {"step": "each", "depth": 0, "tree": "run_1", "index": i, "item": x}
        for i, x in enumerate("abc")
    ]
    assert all(p.root_run_id == "run_1" and p.trigger == "part" for p in store.inserted)
    assert waiting(cur).output == {"parts": 3, "until": None}


async def test_a_map_over_nothing_completes_at_once() -> None:
    step = build_step({"id": "each", "type": "map", "items": [],
                       "steps": [{"id": "t", "type": "transform", "output": 1}]})  # fmt: skip
    assert isinstance(step, Suspending)
    cur = FakeCursor()
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is None
    [(record, out, _)] = cur.ended
    assert record.status is StepStatus.COMPLETED and out.output == []


@pytest.mark.parametrize("kind", ["map", "parallel"])
async def test_parts_gathered_when_all_completed(kind: str) -> None:
    if kind == "map":
        parts = [a_part(i, RunStatus.COMPLETED, index=i) for i in range(3)]
        spec: dict[str, Any] = {"type": "map", "items": [0, 1, 2], "steps": []}
    else:
        parts = [a_part(i, RunStatus.COMPLETED, branch=b) for i, b in enumerate("xy")]
        spec = {"type": "parallel", "branches": {"x": [], "y": []}}
    step = build_step({"id": "fan", **spec})
    assert isinstance(step, MapStep | ParallelStep)
    step.store = FakeRuns(parts=parts)
    prior = RunStep(idx=0, step_id="fan", type=kind, status=StepStatus.WAITING, attempts=1,
                    started_at=T0, output={"parts": len(parts), "until": None})  # fmt: skip
    cur = FakeCursor(at=T0 + timedelta(seconds=5))
    assert await step.wake(fake(cur), prior, cur.at) is None
    [(record, _, durable)] = cur.ended
    assert record.status is StepStatus.COMPLETED and durable
    if kind == "map":
        assert record.output == [{"n": 0}, {"n": 1}, {"n": 2}] and cur.branches_seen == []
    else:
        assert record.output == {"x": {"n": 0}, "y": {"n": 1}} and cur.branches_seen == [0]
    assert cur.run.steps_executed == 2 * len(parts)


async def test_a_failed_item_stops_the_others_and_fails_the_map() -> None:
    parts = [a_part(0, RunStatus.COMPLETED, index=0), a_part(1, RunStatus.FAILED, index=1),
             a_part(2, RunStatus.RUNNING, index=2)]  # fmt: skip
    parts[1].error = {"message": "boom"}
    store = FakeRuns(parts=parts)
    step = build_step({"id": "fan", "type": "map", "items": [], "steps": []})
    assert isinstance(step, MapStep)
    step.store = store
    prior = RunStep(idx=3, step_id="fan", type="map", status=StepStatus.WAITING, attempts=1,
                    started_at=T0, output={"parts": 3, "until": None})  # fmt: skip
    cur = FakeCursor(idx=3, at=T0 + timedelta(seconds=5))
    assert await step.wake(fake(cur), prior, cur.at) is RunStatus.FAILED
    assert store.stopped == [("run_1", 3)]
    [(record, _, _)] = cur.ended
    assert record.error == {"type": "item_failed", "message": "item 1 failed: boom", "index": 1}


async def test_parts_still_going_before_the_deadline_sleep_again() -> None:
    store = FakeRuns(parts=[a_part(0, RunStatus.RUNNING, index=0)])
    step = build_step({"id": "fan", "type": "map", "items": [], "steps": [],
                       "timeout_seconds": 60})  # fmt: skip
    assert isinstance(step, MapStep)
    step.store = store
    prior = RunStep(idx=0, step_id="fan", type="map", status=StepStatus.WAITING, attempts=1,
                    started_at=T0, output={"parts": 1, "until": "2026-01-02T03:05:05Z"})  # fmt: skip
    cur = FakeCursor(at=T0 + timedelta(seconds=5))
    assert await step.wake(fake(cur), prior, cur.at) is RunStatus.RUNNING
    assert cur.ended == [] and store.stopped == []
    assert cur.applied[0].changes[0].values["available_at"] == T0 + timedelta(seconds=60)


# -- task ------------------------------------------------------------------------------------


@dataclass
class FakeTasks:
    task: Task | None = None
    inserted: list[Task] = field(default_factory=list)
    retried_at: list[datetime] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)

    async def insert(self, conn: Any, task: Task) -> None:
        self.inserted.append(task)

    async def for_step(self, conn: Any, run_id: str, idx: int, *, lock: bool = True) -> Task | None:
        return self.task

    async def time_out(self, conn: Any, task: Task, now: datetime, message: str) -> bool:
        self.timed_out.append(message)
        task.status, task.error, task.retryable = (
            "failed",
            {"type": "timeout", "message": message},
            True,
        )
        return True

    async def retry(self, conn: Any, task: Task, at: datetime) -> None:
        self.retried_at.append(at)
        task.status = "queued"


def a_task_step(store: FakeTasks, **spec: Any) -> TaskStep:
    step = build_step({"id": "charge", "type": "task", "task": "payments.charge",
                       "input": {"n": "{{ payload.n }}"}, **spec})  # fmt: skip
    assert isinstance(step, TaskStep)
    step.store = store
    return step


def a_task(**kw: Any) -> Task:
    fields: dict[str, Any] = {
        "task_id": "tsk_1", "workspace_id": "ws", "mode": Mode.TEST, "task": "payments.charge",
        "run_id": "run_1", "idx": 0, "root_run_id": "run_1", "flow_id": "wf_1",
        "step_id": "charge", "input": {"n": 1}, "status": "queued", "attempt": 0,
        "available_at": T0, "heartbeat_seconds": 30.0, "created_at": T0,
    }  # fmt: skip
    return Task(**{**fields, **kw})


TASKED = RunStep(idx=0, step_id="charge", type="task", status=StepStatus.WAITING, attempts=1,
                 started_at=T0, output={"task_id": "tsk_1", "task": "payments.charge"})  # fmt: skip


async def test_a_task_step_queues_its_task_in_the_commit_that_puts_the_run_to_sleep() -> None:
    store = FakeTasks()
    step = a_task_step(store, timeout_seconds=60, heartbeat_seconds=10)
    cur = FakeCursor(ctx={"payload": {"n": 7}, "steps": {}})
    attempt, outcome = await reached(step, cur)
    assert await step.park(fake(cur), attempt, outcome) is RunStatus.RUNNING
    [task] = store.inserted
    assert (task.task, task.input, task.status, task.attempt) == (
        "payments.charge",
        {"n": 7},
        "queued",
        0,
    )
    assert (task.heartbeat_seconds, task.timeout_seconds) == (10, 60)
    assert waiting(cur).output == {"task_id": task.task_id, "task": "payments.charge"}
    # in the group write, after the run's progress applied: no transaction of its own
    assert (
        cur.transactions == 0 and cur.applied[0].changes[0].values["available_at"] == cur.deadline
    )


@pytest.mark.parametrize(
    ("task", "retry", "expected"),
    [
        (a_task(status="completed", attempt=2, interrupted=[1], output={"id": "ch_1"}), None, "completed"),
        (a_task(status="running", attempt=1, worker_id="w1"), None, "sleeps"),
        (a_task(status="queued", attempt=1), None, "sleeps"),
        (a_task(status="failed", attempt=1, retryable=True, error={"message": "no"}),
         {"max_attempts": 2, "backoff_seconds": 3}, "retried"),
        (a_task(status="failed", attempt=2, retryable=True, error={"message": "no"}),
         {"max_attempts": 2}, "failed"),
        (a_task(status="failed", attempt=1, retryable=False, error={"message": "no"}),
         {"max_attempts": 5}, "failed"),
        (a_task(status="running", attempt=1, attempt_deadline=T0), None, "timed out"),
        (None, None, "gone"),
    ],
)  # fmt: skip
async def test_a_task_step_wakes_by_its_task_s_end(
    task: Task | None, retry: dict[str, Any] | None, expected: str
) -> None:
    store = FakeTasks(task=task)
    step = a_task_step(store, **({"retry": retry} if retry else {}), timeout_seconds=60)
    cur = FakeCursor(at=T0 + timedelta(seconds=5))
    status = await step.wake(fake(cur), TASKED, cur.at)
    if expected == "sleeps":
        assert status is RunStatus.RUNNING and cur.ended == []
        return
    if expected == "retried":
        assert status is RunStatus.RUNNING and store.retried_at == [cur.at + timedelta(seconds=3)]
        [progress] = cur.applied
        [event] = progress.events
        assert event.type == "flow.step_failed" and b'"will_retry":true' in event.payload
        [record] = progress.steps
        assert record.status is StepStatus.WAITING and record.attempts == 1
        return
    [(record, _, durable)] = cur.ended
    if expected == "completed":
        assert record.status is StepStatus.COMPLETED and durable
        assert (record.output, record.attempts, record.interrupted) == ({"id": "ch_1"}, 2, (1,))
        assert cur.transactions == 0  # a completed task is read, not locked
        return
    assert status is RunStatus.FAILED and record.error is not None
    if expected == "timed out":
        assert store.timed_out and record.error["type"] == "timeout"
    elif expected == "gone":
        assert record.error["message"] == "the step's task is gone"
    else:
        assert record.error == {"type": "task", "message": "no", "task_id": "tsk_1"}
