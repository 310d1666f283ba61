"""Runs: start (the spec's execute), read, list, cancel."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from flowhook import tracing
from flowhook.clock import Clock
from flowhook.definition.control import (
    FlowControl,
    Keys,
    check_priority,
    debounce_due,
    debounce_open,
)
from flowhook.definition.input_schema import check_payload
from flowhook.definition.schema import NESTING
from flowhook.errors import Conflict, Duplicate, IdempotencyConflict, InvalidInput, StoreUnavailable
from flowhook.events import cancelled_event, run_duration_ms
from flowhook.group_commit import GroupCommit
from flowhook.ids import is_id, new_id
from flowhook.service import waiting
from flowhook.service.active import ActiveRuns
from flowhook.service.auth import Principal
from flowhook.service.idempotency import (
    Keyed,
    body_hash,
    check_key,
    keyed_earlier,
    keyed_runs,
    request_hash,
    within_window,
)
from flowhook.service.jsonvalues import encode_json
from flowhook.service.lookup import missing
from flowhook.service.pagination import Page, listed
from flowhook.service.rerun import parse_version, plan_rerun
from flowhook.service.tasks import WORKERS_SEEN
from flowhook.store import children as children_store
from flowhook.store import control as store_control
from flowhook.store import events as events_store
from flowhook.store import flows as flows_store
from flowhook.store import runs as runs_store
from flowhook.store import tasks as tasks_store
from flowhook.store import trees as trees_store
from flowhook.store.db import Connection, Database
from flowhook.store.models import Event, Flow, Run, RunStatus, StepStatus
from flowhook.store.statistics import StatisticsKeeper
from flowhook.store.trees import TreeCancel
from flowhook.store.wakeup import Wakeup

if TYPE_CHECKING:
    from flowhook.service.streams import EventHub

__all__ = ["RunService", "Started", "TRIGGERS"]

TRIGGERS = ("api",)
"""Triggers a caller may name; ``webhook`` and ``schedule`` are set by the service itself."""

MAX_WAIT = 60.0
LONG_POLL_INTERVAL = 0.1
"""Seconds between a long poll's reads of its run when no event hub wakes it."""
LONG_POLL_FALLBACK = 1.0
"""Seconds a long poll woken by the event hub waits at most between reads (a wake-up lost
with a hub's failed read costs that much)."""
PLANNED_TABLES = ("runs",)
"""Tables whose statistics PostgreSQL plans the accept path with: gathered as the runs this
process accepts grow (see :class:`StatisticsKeeper`)."""


@dataclass(frozen=True, slots=True)
class Started:
    run: Run
    replayed: bool
    """True when an Idempotency-Key matched an earlier request: ``run`` is that request's."""


def _worth_retrying_alone(exc: BaseException) -> bool:
    """A failed batch is redone request by request, unless the store itself is down."""
    return isinstance(exc, Exception) and not isinstance(exc, StoreUnavailable)


def _replayed(seen: tuple[Run, str | None], digest: str | None) -> Started | IdempotencyConflict:
    """The answer to a request whose key started ``seen``: that run again when the request is
    the same, else a conflict."""
    earlier, earlier_hash = seen
    if earlier_hash != digest:
        return IdempotencyConflict("this Idempotency-Key was used with a different request body")
    return Started(earlier, replayed=True)


@dataclass(frozen=True, slots=True)
class _StartRequest:
    who: Principal
    flow_id: str
    payload: dict[str, Any]
    encoded: orjson.Fragment
    """``payload`` as the store writes it, encoded once before the request joins a batch."""
    trigger: str
    key: str | None
    digest: str | None
    priority: int | None = None
    traceparent: str | None = None
    keys: Keys | None = None
    """The flow control keys of ``payload``, read before the request joined a batch..."""
    version: int | None = None
    """... for this version of the flow (the batch's may be newer: then they are read again)."""


class _KeysNeeded(Exception):
    """The batch met a flow version with flow control whose keys the request does not carry,
    or with an ``input_schema`` its payload was not checked against: :meth:`RunService.start`
    reads the keys and checks the payload, outside any transaction, and submits it again."""

    def __init__(self, version: int, control: FlowControl | None, schema: Any = None) -> None:
        super().__init__(version)
        self.version = version
        self.control = control
        self.schema = schema


class RunService:
    def __init__(self, db: Database, clock: Clock, wakeup: Wakeup, *, max_active: int = 0) -> None:
        self._db = db
        self.active = ActiveRuns(db, max_active)
        """The cap on a workspace's unfinished runs (0: none)."""
        self._clock = clock
        self._wakeup = wakeup
        self._group: GroupCommit[_StartRequest, Started] = GroupCommit(
            self._commit_starts, isolate=_worth_retrying_alone
        )
        self.statistics = StatisticsKeeper(db, PLANNED_TABLES)
        """Counts the runs this process accepts, for the statistics of ``runs``."""
        self._controls: dict[tuple[str, int], FlowControl | None] = {}
        """Flow control of flow versions met (a version never changes)."""
        self._latest: dict[tuple[str, str, str], tuple[int, FlowControl | None, Any]] = {}
        """The version of each flow the batches last met, with its flow control and its
        ``input_schema``, by (workspace, mode, flow): an execute reads its keys and checks its
        payload before joining a batch (never inside the write every tenant's executes share)."""
        self.hub: EventHub | None = None
        """The process's event hub, which wakes a long poll when its run's events commit
        (``None``: long polls read every :data:`LONG_POLL_INTERVAL`)."""

    async def start(
        self,
        who: Principal,
        *,
        flow_id: str,
        payload: dict[str, Any],
        trigger: str = "api",
        idempotency_key: str | None = None,
        parsed_by_orjson: bool = False,
        priority: int | None = None,
        traceparent: str | None = None,
    ) -> Started:
        """Queue a run: the run row (its own queue entry) is committed before this returns.
        Concurrent calls share a write (group commit): a transaction, or on PostgreSQL, when
        no call of the batch has a key or flow control, one statement. ``parsed_by_orjson``: the
        payload holds no NaN or Infinity (orjson's parser refuses them). ``traceparent``:
        the trace context the run joins, checked already (:func:`flowhook.tracing.accept`)."""
        if trigger not in TRIGGERS:
            allowed = ", ".join(repr(t) for t in TRIGGERS)
            raise InvalidInput(
                f"trigger must be one of {allowed}, not {trigger!r}", field="trigger"
            )
        if not flow_id.startswith("wf_") or len(flow_id) > 40 or not flow_id.isprintable():
            raise InvalidInput(f"flow_id must look like wf_…, not {flow_id!r}", field="flow_id")
        check_key(idempotency_key)
        encoded = encode_json(payload, "payload", finite=parsed_by_orjson)
        digest = request_hash(flow_id, trigger, payload) if idempotency_key else None
        if priority is not None:
            priority = check_priority(priority, "priority")
        self.active.check(who)
        request = _StartRequest(
            who, flow_id, payload, encoded, trigger, idempotency_key, digest, priority, traceparent
        )
        known = self._latest.get((who.workspace_id, str(who.mode), flow_id))
        for _ in range(3):  # a flow saved again between two tries: rare, twice rarer
            if known is not None:
                version, control, schema = known
                # Outside any transaction and before the batch: a tenant's slow keys or large
                # payload keep only its own execute waiting (KEY_SECONDS each at most).
                if schema is not None:
                    check_payload(flow_id, version, schema, payload)  # 400, nothing stored
                if control is not None:
                    keys = await control.keys(payload, priority)
                    request = replace(request, keys=keys, version=version)
                elif schema is not None:
                    request = replace(request, version=version)
            try:
                started = await self._group.submit(request)
                break
            except _KeysNeeded as needed:
                known = (needed.version, needed.control, needed.schema)
        else:
            raise StoreUnavailable("the flow kept changing while this execute ran; try again")
        if not started.replayed:
            self.statistics.wrote(1)
            self.active.accepted(who)
        return started

    async def _commit_starts(self, batch: Sequence[_StartRequest]) -> list[Started | BaseException]:
        flows: dict[tuple[str, str, str], Flow | None] = {}
        try:
            if self._db.autocommits_statements and all(r.key is None for r in batch):
                started = await self._start_at_once(batch, flows)
                if started is not None:
                    return started
            async with self._db.transaction() as conn:  # the flows already read: as good
                return await self._start_many(conn, batch, flows)
        except Duplicate:
            # Another process committed the same Idempotency-Key first: redo one by one, so
            # each request answers as that key now dictates.
            results: list[Started | BaseException] = []
            for request in batch:
                try:
                    async with self._db.transaction() as conn:
                        [result] = await self._start_many(conn, [request])
                except Duplicate:
                    async with self._db.transaction() as conn:
                        [result] = await self._start_many(conn, [request])
                results.append(result)
            return results

    async def _start_at_once(
        self, batch: Sequence[_StartRequest], flows: dict[tuple[str, str, str], Flow | None]
    ) -> list[Started | BaseException] | None:
        """Where :meth:`Database.statement` autocommits (PostgreSQL), a batch without an
        Idempotency-Key: its flows read (into ``flows``), then its runs and the workers'
        ``NOTIFY`` written as one statement
        (:func:`runs_store.insert_runs` with ``alone``), in autocommit: two round trips where
        a transaction took five (``BEGIN``, the flow, the runs, ``NOTIFY``, ``COMMIT``). One
        statement is atomic on its own, and the flows' read takes the snapshot it took in the
        transaction (READ COMMITTED, no lock). ``None`` when a flow of the batch has flow
        control: its locks and reads need the transaction.
        """
        async with self._db.statement() as conn:
            for req in batch:
                await self._flow_of(conn, req, flows)
            if any(f is not None and self._control(f) is not None for f in flows.values()):
                return None
            return await self._start_many(conn, batch, flows, alone=True)

    @staticmethod
    async def _flow_of(
        conn: Connection, req: _StartRequest, flows: dict[tuple[str, str, str], Flow | None]
    ) -> Flow | None:
        """The flow ``req`` executes, read once per batch (``flows``)."""
        who = req.who
        key = (who.workspace_id, str(who.mode), req.flow_id)
        if key not in flows:
            flows[key] = await flows_store.get_flow(conn, who.workspace_id, who.mode, req.flow_id)
        return flows[key]

    async def _start_many(
        self,
        conn: Connection,
        batch: Sequence[_StartRequest],
        flows: dict[tuple[str, str, str], Flow | None] | None = None,
        *,
        alone: bool = False,
    ) -> list[Started | BaseException]:
        """The batch's runs written on ``conn``; ``flows``: those already read; ``alone``:
        ``conn`` is in autocommit (:meth:`_start_at_once`)."""
        now = self._clock.now()
        results: list[Started | BaseException] = []
        rows: list[tuple[Run, str | None, str | None]] = []
        encoded: list[orjson.Fragment] = []
        flows = {} if flows is None else flows
        keyed: dict[Keyed, tuple[Run, str | None]] = {}
        """Runs this batch queues with an Idempotency-Key (a later request repeats one)."""
        earlier = await keyed_runs(
            conn, [(r.who.workspace_id, r.who.mode, r.key) for r in batch if r.key is not None]
        )
        debounced: dict[tuple[str, str], tuple[Run, int]] = {}
        """Debounced runs this batch queues, with their place in ``encoded``."""
        for req in batch:
            who = req.who
            if req.key is not None:
                scoped = (who.workspace_id, who.mode, req.key)
                seen = keyed.get(scoped)
                if seen is None and earlier.get(scoped) is not None:  # forgotten: None
                    seen = earlier[scoped] = await within_window(conn, earlier[scoped], now)
                if seen is not None:
                    results.append(_replayed(seen, req.digest))
                    continue
            flow = await self._flow_of(conn, req, flows)
            if flow is None:
                results.append(missing("flow", req.flow_id))
                continue
            control = self._control(flow)
            schema = flow.definition.get("input_schema")
            self._remember(who, flow, control, schema)
            keys = None
            if schema is not None and req.version != flow.version:
                results.append(_KeysNeeded(flow.version, control, schema))  # checked outside
                continue
            if control is not None:
                if req.keys is None or req.version != flow.version:
                    results.append(_KeysNeeded(flow.version, control, schema))  # read outside
                    continue
                keys = req.keys
                if keys.debounce_key is not None:
                    joined = await self._join(conn, flow, control, keys.debounce_key, req,
                                              debounced, encoded, now)  # fmt: skip
                    if joined is not None:
                        results.append(Started(joined, replayed=False))
                        continue
            run = Run(
                run_id=new_id("run"),
                workspace_id=who.workspace_id,
                mode=who.mode,
                flow_id=req.flow_id,
                flow_version=flow.version,
                trigger=req.trigger,
                status=RunStatus.QUEUED,
                payload=req.payload,
                queued_at=now,
                traceparent=req.traceparent,
            )
            if control is not None and keys is not None:
                run.priority = keys.priority
                run.concurrency_key = keys.concurrency_key
                run.throttle_key = keys.throttle_key
                if keys.debounce_key is not None:
                    run.debounce_key = keys.debounce_key
                    run.held = store_control.DEBOUNCE
                    run.due_at = debounce_due(
                        now, now, control.debounce_period, control.debounce_max_wait
                    )
                    debounced[(run.flow_id, keys.debounce_key)] = (run, len(encoded))
            rows.append((run, req.key, req.digest))
            encoded.append(req.encoded)
            if req.key is not None:
                keyed[(who.workspace_id, who.mode, req.key)] = (run, req.digest)
            results.append(Started(run, replayed=False))
        await runs_store.insert_runs(conn, rows, payloads=encoded, alone=alone)
        return results

    def _remember(
        self, who: Principal, flow: Flow, control: FlowControl | None, schema: Any = None
    ) -> None:
        if len(self._latest) >= 4096:
            self._latest.clear()
        scope = (who.workspace_id, str(who.mode), flow.flow_id)
        self._latest[scope] = (flow.version, control, schema)

    def _control(self, flow: Flow) -> FlowControl | None:
        key = (flow.flow_id, flow.version)
        if key not in self._controls:
            if len(self._controls) >= 1024:
                self._controls.clear()
            self._controls[key] = FlowControl.build(flow.definition)
        return self._controls[key]

    async def _join(
        self,
        conn: Connection,
        flow: Flow,
        control: FlowControl,
        key: str,
        req: _StartRequest,
        debounced: dict[tuple[str, str], tuple[Run, int]],
        encoded: list[orjson.Fragment],
        now: datetime,
    ) -> Run | None:
        """The debounced run of ``key`` this execute joins (it takes the payload and starts
        later), or ``None`` to queue a new one."""
        period, max_wait = control.debounce_period, control.debounce_max_wait
        if (flow.flow_id, key) in debounced:  # queued by this batch
            earlier, at = debounced[(flow.flow_id, key)]
            earlier.payload = req.payload
            encoded[at] = req.encoded
            earlier.due_at = debounce_due(earlier.queued_at, now, period, max_wait)
            return earlier
        await store_control.lock(conn, store_control.DEBOUNCE, flow.flow_id, key)
        found = await store_control.joinable(conn, flow.flow_id, key)
        if found is None or found.workspace_id != req.who.workspace_id:
            return None
        if not debounce_open(found.queued_at, now, max_wait):
            return None
        due = debounce_due(found.queued_at, now, period, max_wait)
        if not await store_control.join(conn, found.run_id, req.encoded, due):
            return None
        found.payload = req.payload
        return found

    async def rerun(
        self,
        who: Principal,
        run_id: str,
        *,
        from_step: str | None = None,
        flow_version: int | str | None = None,
        payload: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Started:
        """Queue a rerun of a finished run (DESIGN.md, "Rerun from a step"): a new run of its
        flow, at ``flow_version`` (its own by default, or ``"latest"``) with ``payload`` (its
        own by default), whose steps before ``from_step`` are copied from it, not run again.
        The new run and its reused steps are one commit."""
        if not is_id(run_id, "run"):
            raise missing("run", run_id)
        version = parse_version(flow_version)
        check_key(idempotency_key)
        encoded = None if payload is None else encode_json(payload, "payload")
        request = {"rerun_of": run_id, "from_step": from_step, "flow_version": version}
        digest = body_hash({**request, "payload": payload}) if idempotency_key else None
        now = self._clock.now()
        async with self._db.transaction() as conn:
            if idempotency_key is not None:
                seen = await keyed_earlier(conn, who, idempotency_key, now)
                if seen is not None:
                    answer = _replayed(seen, digest)
                    if isinstance(answer, IdempotencyConflict):
                        raise answer
                    return answer
            original = await runs_store.get_run(conn, who.workspace_id, who.mode, run_id)
            if original is None:
                raise missing("run", run_id)
            if not original.status.terminal:
                raise Conflict(
                    f"run {run_id!r} is {original.status}: only a completed, failed or "
                    "cancelled run can be rerun (cancel it first)",
                    code="run_not_finished",
                )
            flow = await self._rerun_version(conn, who, original, version)
            schema = flow.definition.get("input_schema")
            if payload is not None and schema is not None:  # a new payload meets it too
                check_payload(flow.flow_id, flow.version, schema, payload)
            plan = plan_rerun(original, flow.definition["steps"], flow.version, from_step)
            run = Run(
                run_id=new_id("run"),
                workspace_id=who.workspace_id,
                mode=who.mode,
                flow_id=original.flow_id,
                flow_version=flow.version,
                trigger="rerun",
                status=RunStatus.QUEUED,
                payload=original.payload if payload is None else payload,
                queued_at=now,
                next_step=plan.start,
                rerun_of=original.run_id,
                steps=plan.reused,
                # the rerun joins the trace of the run it reruns, under that run's span
                traceparent=tracing.child_traceparent(
                    original.run_id, original.traceparent, tracing.run_span_id(original.run_id)
                ),
            )
            await self._rerun_keys(flow, run)
            await runs_store.insert_runs(
                conn,
                [(run, idempotency_key, digest)],
                payloads=None if encoded is None else [encoded],
            )
            await runs_store.insert_steps(conn, run.run_id, plan.reused)
        return Started(run, replayed=False)

    async def _rerun_keys(self, flow: Flow, run: Run) -> None:
        """A rerun is paced like an execute of its flow version: its priority, concurrency
        and throttle keys are read from its payload (400 naming the field when they fail).
        It is not debounced: it is one asked-for run, not a burst to collapse."""
        control = self._control(flow)
        if control is None:
            return
        keys = await control.keys(run.payload, None)
        run.priority = keys.priority
        run.concurrency_key = keys.concurrency_key
        run.throttle_key = keys.throttle_key

    async def _rerun_version(
        self, conn: Connection, who: Principal, original: Run, version: int | str | None
    ) -> Flow:
        """The flow at the version a rerun of ``original`` runs (its current definition when
        ``"latest"``); 404 when the flow is gone, 400 when the version does not exist."""
        flow = await flows_store.get_flow(conn, who.workspace_id, who.mode, original.flow_id)
        if flow is None:
            raise missing("flow", original.flow_id)
        wanted = original.flow_version if version is None else version
        if wanted == "latest" or wanted == flow.version:
            return flow
        assert isinstance(wanted, int)
        found = await flows_store.get_flow(
            conn, who.workspace_id, who.mode, original.flow_id, version=wanted
        )
        if found is None:
            raise InvalidInput(
                f"flow {original.flow_id} has no version {wanted} (its latest is {flow.version})",
                field="flow_version",
            )
        return found

    async def get(
        self, who: Principal, run_id: str, *, nested: bool = True, why: bool = True
    ) -> Run:
        """The run with its step records, and (``nested``) those of its branches and items
        after the step that ran them; ``why``: why it waits, where a read must look (a task
        step's worker)."""
        if not is_id(run_id, "run"):
            raise missing("run", run_id)
        async with self._db.read() as conn:
            run = await runs_store.get_run(conn, who.workspace_id, who.mode, run_id)
            if nested and run is not None and any(s.type in NESTING for s in run.steps):
                parts = await children_store.nested_of(conn, run_id)
                run.steps = children_store.with_nested(run.steps, parts, run_id)
            if run is not None and why:
                await self._why_waiting(conn, run)
        if run is None:
            raise missing("run", run_id)
        return run

    async def _why_waiting(self, conn: Connection, run: Run) -> None:
        """Why an active run is not executing a step (``waiting_for``): a queued one's worker
        or flow control (with the runs holding the slots), a sleeping one's step (who holds
        its task, or that no worker runs it)."""
        if run.status is RunStatus.QUEUED:
            why = waiting.why_queued(run)
            if why is not None and why["reason"] == "concurrency":
                key = why.get("key") or ""
                why["held_by"] = await store_control.slot_holders(conn, run.flow_id, key)
            run.waiting = why
            return
        step = waiting.sleeping_step(run)
        if step is None:
            return
        if step.type == "task" and step.status is StepStatus.WAITING:
            since = self._clock.now() - WORKERS_SEEN
            why = await tasks_store.why_waiting(
                conn, run.workspace_id, run.mode, run.run_id, step.idx, since
            )
            run.waiting = None if why is None else {**why, "step_id": step.step_id}
            return
        run.waiting = waiting.why_sleeping(run, step)

    async def wait_for(self, who: Principal, run_id: str, seconds: float) -> Run:
        """Long-poll: the run as soon as it is terminal, or as it is after ``seconds``.

        The run is read again when one of its events is committed (the event hub wakes the
        poll: a run that ends is seen within milliseconds, where reading every 0.1 s saw it
        up to 0.1 s late), and at least every :data:`LONG_POLL_FALLBACK` s."""
        if not 0 <= seconds <= MAX_WAIT:
            raise InvalidInput(f"wait must be between 0 and {MAX_WAIT:g} seconds", field="wait")
        clock = asyncio.get_running_loop().time
        deadline = clock() + seconds
        hub = self.hub
        woken = None if hub is None or hub.closing else hub.watch(who, run_id)
        try:
            while True:
                run = await self.get(who, run_id, nested=False, why=False)
                left = deadline - clock()
                if run.status.terminal or left <= 0 or (woken is not None and woken.ended):
                    return await self.get(who, run_id)
                if woken is None:
                    await asyncio.sleep(min(LONG_POLL_INTERVAL, left))
                else:  # an event of the run, or the fallback's time
                    await woken.next_batch(min(LONG_POLL_FALLBACK, left))
        finally:
            if woken is not None and hub is not None:
                hub.unsubscribe(woken)

    async def children(self, who: Principal, run_id: str) -> dict[int, Run]:
        """The child runs the run's ``flow`` steps started, by step index."""
        await self.get(who, run_id, nested=False)
        async with self._db.read() as conn:
            return await children_store.children_of(conn, run_id)

    async def events(self, who: Principal, run_id: str) -> list[Event]:
        await self.get(who, run_id, nested=False)
        async with self._db.read() as conn:
            return await events_store.list_events_for_run(conn, run_id)

    async def events_page(
        self, who: Principal, run_id: str, *, limit: int, cursor: str | None
    ) -> Page[Event]:
        """One page of the run's events, oldest first; ``cursor``: the last event of the
        page before."""
        await self.get(who, run_id, nested=False)

        async def fetch(conn: Connection, after: str | None, n: int) -> list[Event]:
            return await events_store.list_events_for_run(conn, run_id, after=after, limit=n)

        return await listed(
            self._db, "evt", limit=limit, cursor=cursor, fetch=fetch, cursor_of=lambda e: e.id
        )

    async def list(
        self,
        who: Principal,
        *,
        limit: int,
        cursor: str | None,
        flow_id: str | None = None,
        status: str | None = None,
        asleep: str | None = None,
    ) -> Page[Run]:
        """A page of runs, newest first; ``asleep``: only running runs asleep in a step of
        that type (``approval``: waiting for a person; ``wait``: for a signal)."""
        wanted: RunStatus | None = None
        if status:
            try:
                wanted = RunStatus(status)
            except ValueError:
                allowed = ", ".join(s.value for s in RunStatus)
                raise InvalidInput(f"status must be one of {allowed}", field="status") from None
        return await listed(
            self._db, "run", limit=limit, cursor=cursor, cursor_of=lambda row: row.run_id,
            fetch=lambda conn, after, n: runs_store.list_runs(
                conn, who.workspace_id, who.mode, limit=n, after=after,
                flow_id=flow_id or None, status=wanted, asleep=asleep,
            ),
        )  # fmt: skip

    async def explain(self, who: Principal, found: Sequence[Run]) -> None:
        """Say why each active run of a list waits (:attr:`Run.waiting_for`), as the run's
        own read would but in one read for all: a queued run's worker or flow control, a
        sleeping run's step (a task's without who holds it, a parallel's without its parts'
        counts: the run's page has those)."""
        asleep = [r.run_id for r in found if r.status is RunStatus.RUNNING]
        steps = {}
        if asleep:  # no read at all for a page with no running run
            async with self._db.read() as conn:
                steps = await runs_store.sleeping_steps(conn, asleep)
        for run in found:
            if run.status is RunStatus.QUEUED:
                run.waiting = waiting.why_queued(run)
            elif run.run_id in steps:
                step = steps[run.run_id]
                why = waiting.why_sleeping(run, step)
                if why is None and step.type == "task":
                    task = step.output.get("task") if isinstance(step.output, dict) else None
                    why = {"reason": "task", "step_id": step.step_id, "task": task}
                run.waiting = why

    async def cancel(self, who: Principal, run_id: str) -> Run:
        """Cancel a run no worker holds at once; flag one a worker holds, which it then ends
        within a second (its step in flight is interrupted)."""
        if not is_id(run_id, "run"):
            raise missing("run", run_id)
        now = self._clock.now()
        async with self._db.transaction() as conn:
            run = await self._unfinished(conn, who, run_id)
            if run.parent_run_id is not None:  # locks before rows (the lock order rule)
                await children_store.lock_parent(conn, run.parent_run_id)
            cancelled = await self._cancel_unleased(conn, who, run, now)
            if not cancelled:
                # A worker holds it (or it moved, or ended): flag it, and the worker ends it.
                # Unless that worker handed it back (a delay, a wait) between the try above
                # and the flag: the flag's row lock now keeps it as it is, and no write would
                # come before its wake, so it is cancelled here.
                held = await runs_store.request_cancel(
                    conn, who.workspace_id, who.mode, run_id, now
                )
                run = await self._unfinished(conn, who, run_id)  # as it is now
                if held is False:
                    cancelled = await self._cancel_unleased(conn, who, run, now)
            if cancelled:
                run.duration_ms = run_duration_ms(run, now)  # as cancel_unleased wrote it
                run.status = RunStatus.CANCELLED
                run.finished_at = run.cancel_requested_at = now
                ended = [run, *await children_store.cancel_children(conn, [run_id], now)]
                await store_control.free_slots(conn, ended, now)
                await events_store.insert_events(conn, [cancelled_event(r, now) for r in ended])
                if run.parent_run_id is not None:
                    await children_store.wake_parent(conn, run.parent_run_id, now)
            else:
                ended = []
        if ended and tracing.ENABLED:  # no worker holds them: their spans end here
            for r in ended:
                tracing.run_span(r, "cancelled", None, now)
        if not ended:
            self._wakeup.notify()
        return run

    async def cancel_tree(self, who: Principal, run_id: str) -> tuple[Run, TreeCancel]:
        """Cancel a top-level run, finished or not, and every unfinished run of its tree (the
        runs its ``flow`` steps started, theirs, and the branches and items of all of them),
        in a fixed number of statements whatever the tree's size, across processes: runs no
        worker holds end here, the others are flagged and their workers end them. No run of
        the tree may start another afterwards."""
        run = await self.get(who, run_id, nested=False)
        if run.parent_run_id is not None:
            raise Conflict(
                f"run {run_id!r} was started by a flow step of another run; cancel the tree "
                f"from its top-level run {run.tree!r}",
                code="not_top_level",
            )
        if not run.status.terminal:
            with contextlib.suppress(Conflict):  # it ended meanwhile: its tree still goes
                run = await self.cancel(who, run_id)
        now = self._clock.now()
        async with self._db.transaction() as conn:
            tree = await trees_store.cancel_tree(conn, run.run_id, now)
            await store_control.free_slots(conn, tree.ended, now)
            runs_ended = [r for r in tree.ended if r.root_run_id is None]  # not the parts
            await events_store.insert_events(conn, [cancelled_event(r, now) for r in runs_ended])
        if tracing.ENABLED:
            for r in runs_ended:
                tracing.run_span(r, "cancelled", None, now)
        if tree.flagged:
            self._wakeup.notify()
        return run, tree

    async def _cancel_unleased(
        self, conn: Connection, who: Principal, run: Run, now: datetime
    ) -> bool:
        """End ``run`` cancelled if no worker holds it and it has not moved since read."""
        return await runs_store.cancel_unleased(
            conn, who.workspace_id, who.mode, run.run_id, now,
            duration_ms=run_duration_ms(run, now), steps_executed=run.steps_executed,
        )  # fmt: skip

    async def _unfinished(self, conn: Connection, who: Principal, run_id: str) -> Run:
        """The run, which has not ended yet (else Conflict)."""
        run = await runs_store.get_run(conn, who.workspace_id, who.mode, run_id)
        if run is None:
            raise missing("run", run_id)
        if run.status.terminal:
            raise Conflict(f"run {run_id!r} has already ended ({run.status})", code="run_finished")
        return run
