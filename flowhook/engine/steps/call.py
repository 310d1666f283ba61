"""``flow``: start a child run of another flow of the same workspace and mode (trigger
``flow``, its record's ``parent_run_id`` names this run). With ``wait`` (the default) the run
sleeps, holding no worker, until the child ends: its output is the child's, and a failed or
cancelled child fails the step; ``timeout_seconds`` bounds the wait (the child is then
cancelled). ``wait: false`` goes on at once with ``{"run_id"}``. The step evaluates the
child's payload; its durable half starts the child (one unit of the tree's budget,
``FLOWHOOK_MAX_RUN_TREE``) and wakes the run when the child ends."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.definition.input_schema import MAX_PROBLEMS_SHOWN, payload_problems
from flowhook.engine.steps.base import Action, Context, Outcome, StepBase, StepEnv, error
from flowhook.engine.steps.delay import parse_time
from flowhook.engine.steps.nested import STORE, NestedStore
from flowhook.events import cancelled_event, elapsed_ms
from flowhook.ids import new_id
from flowhook.store.models import Run, RunStatus, RunStep, StepStatus

if TYPE_CHECKING:
    from flowhook.engine.durable import Attempt, Cursor
    from flowhook.store.runs import Progress

__all__ = ["CallStep", "MAX_DEPTH"]

MAX_DEPTH = 10
"""How deep sub-flows may nest: a run of depth 10 cannot start a child."""


class CallStep(StepBase, kind="flow", pure=False, external=False, limited=False):
    store: NestedStore = STORE

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.flow_id: str = spec["flow_id"]
        self._payload = compile_value(spec.get("payload", {}))
        self.wait: bool = spec.get("wait", True)
        self.timeout_after: float | None = spec.get("timeout_seconds")

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        """The child to start: ``{"flow_id", "payload", "wait", "until"}``, suspending the
        run."""
        try:
            payload = await evaluate(self._payload, ctx)
        except ExpressionError as exc:
            return error("expression", f"payload: {exc}")
        if not isinstance(payload, dict):
            return error("expression", "payload must evaluate to an object")
        now = env.clock.now()
        until = None
        if self.wait and self.timeout_after is not None:
            until = now + timedelta(seconds=self.timeout_after)
        output = {
            "flow_id": self.flow_id,
            "payload": payload,
            "wait": self.wait,
            "until": isoformat(until) if until is not None else None,
        }
        return Outcome(output=output, action=Action.SUSPEND, wait_until=until)

    async def park(self, cur: Cursor, attempt: Attempt, outcome: Outcome) -> RunStatus | None:
        """Start the child run and, with ``wait``, sleep without a lease until its end wakes
        the run (or the step's time is up); else go on with ``{"run_id"}``. The child's
        insert and the step's record are one commit, so a crash never starts a second
        child."""
        run, spec = cur.run, outcome.output
        depth = int((run.scope or {}).get("depth", 0)) + 1
        if depth > MAX_DEPTH:
            problem = f"sub-flows nest deeper than {MAX_DEPTH} (this run is at depth {depth - 1})"
            return await cur.failed(attempt, "flow_depth", problem)
        async with cur.read() as conn:
            flow = await self.store.get_flow(conn, run.workspace_id, run.mode, spec["flow_id"])
        if flow is None:  # another workspace's or mode's flow is not found either
            return await cur.failed(
                attempt, "flow_not_found", f"flow {spec['flow_id']!r} not found"
            )
        schema = flow.definition.get("input_schema")
        if schema is not None:  # the child's payload meets its flow's schema, as an execute's
            wrong = payload_problems(
                flow.flow_id, flow.version, schema, spec["payload"], limit=MAX_PROBLEMS_SHOWN
            )
            if wrong:
                said = "; ".join(f"{field}: {message}" for field, message in wrong)
                problem = f"the payload does not match the input_schema of {flow.name!r}: {said}"
                return await cur.failed(attempt, "schema", problem)
        now = cur.now()
        child = Run(
            run_id=new_id("run"), workspace_id=run.workspace_id, mode=run.mode,
            flow_id=flow.flow_id, flow_version=flow.version, trigger="flow",
            status=RunStatus.QUEUED, payload=spec["payload"], queued_at=now,
            parent_run_id=run.run_id, parent_idx=attempt.idx,
            scope={"depth": depth, "caller": run.root_run_id or run.run_id, "tree": run.tree},
            traceparent=cur.under_step(attempt), tree_run_id=run.tree,
        )  # fmt: skip
        async with cur.transaction() as conn:
            # The tree's budget first: refused, nothing of this transaction is written.
            refused = await self.store.take_child(conn, run.tree, cur.max_run_tree)
            if refused is None:
                progress = self._started(cur, attempt, outcome, child, now)
                await self.store.insert_run(conn, child)
                await cur.apply_in(conn, progress)
        if refused == "budget":
            problem = (
                f"the runs started under {run.tree} reached {cur.max_run_tree}, the most "
                "one run's sub-flows may start (FLOWHOOK_MAX_RUN_TREE)"
            )
            return await cur.failed(attempt, "run_tree_exhausted", problem)
        if refused is not None:
            problem = f"the runs under {run.tree} were cancelled; no run may start there"
            return await cur.failed(attempt, "run_tree_cancelled", problem)
        cur.written()
        return RunStatus.RUNNING if spec["wait"] else None

    def _started(
        self, cur: Cursor, attempt: Attempt, outcome: Outcome, child: Run, now: datetime
    ) -> Progress:
        """The run's progress once the step started ``child``: with ``wait``, asleep in the
        step; else on past it with ``{"run_id"}`` (recorded here, committed with the child)."""
        spec = outcome.output
        if spec["wait"]:
            output = {"run_id": child.run_id, "flow_id": child.flow_id, "until": spec["until"]}
            cur.add(attempt.waiting(output))
            return cur.progress(wake=min(outcome.wait_until or cur.deadline, cur.deadline))
        done = Outcome(output={"run_id": child.run_id})
        cur.record(attempt.record(StepStatus.COMPLETED, now, done))
        cur.idx += 1
        return cur.progress()

    async def wake(self, cur: Cursor, prior: RunStep, now: datetime) -> RunStatus | None:
        """The child ended (the step takes its output, or fails), the wait's time is up (the
        child is cancelled, the step fails), or the run was woken early (it sleeps again,
        under the lock the child's end takes)."""
        run, store = cur.run, self.store
        until = prior.output.get("until")
        deadline = min(parse_time(until), cur.deadline) if until else cur.deadline
        async with cur.transaction() as conn:
            await store.lock_parent(conn, run.run_id)
            child = await store.child_at(conn, run.run_id, cur.idx)
            going = child is not None and not child.status.terminal
            if going and now < deadline:
                await cur.apply_in(conn, cur.progress(wake=deadline))
                cur.written()
                return RunStatus.RUNNING
            if going:  # its time is up: the child goes too
                ended = await store.stop(conn, run.run_id, now)
                await store.insert_events(conn, [cancelled_event(r, now) for r in ended])
        finished = replace(
            prior, finished_at=now, duration_ms=elapsed_ms(prior.started_at or now, now)
        )
        error = self._child_error(prior.output["run_id"], child, going, cur.timeout)
        if error is not None:
            failed = replace(finished, status=StepStatus.FAILED, output=None, error=error)
            return await cur.done(self, failed, Outcome(error=error, action=Action.FAIL))
        assert child is not None
        completed = replace(finished, status=StepStatus.COMPLETED, output=child.output)
        # the child's end is stored (its run): found again after a crash
        return await cur.done(self, completed, Outcome(output=child.output), durable=True)

    def _child_error(
        self, child_id: str, child: Run | None, going: bool, run_timeout: float
    ) -> dict[str, Any] | None:
        """Why the step fails, by how its child ended; ``None`` when it completed."""
        error: dict[str, Any] | None = None
        if child is None:
            error = {"type": "child_failed", "message": f"child run {child_id} is gone"}
        elif going:
            seconds = self.timeout_after or run_timeout
            error = {
                "type": "timeout",
                "message": f"child run {child_id} did not end within {seconds:g} s; "
                "it was cancelled",
            }
        elif child.status is RunStatus.FAILED:
            why = (child.error or {}).get("message", "")
            error = {"type": "child_failed", "message": f"child run {child_id} failed: {why}"}
        elif child.status is RunStatus.CANCELLED:
            error = {"type": "child_cancelled", "message": f"child run {child_id} was cancelled"}
        if error is not None:
            error["run_id"] = child_id
        return error
