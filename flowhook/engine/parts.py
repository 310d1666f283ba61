"""What the steps of a run see of the runs around them: the context of a *part* (a branch of
a ``parallel``, an item of a ``map``), and the steps of finished branches, which later steps
reach as ``steps.<id>``."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from datetime import datetime

from flowhook.engine.steps import Context
from flowhook.store import children as children_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Run, RunStep, StepStatus

__all__ = ["Scopes", "context", "see", "see_branches"]

Scope = tuple[Context, datetime]
"""What a part sees of the runs around it, and when its top-level run started."""


def see(ctx: Context, steps: list[RunStep] | dict[int, RunStep]) -> None:
    """Let later steps reach ``steps`` that finished (completed or skipped) as
    ``steps.<id>``."""
    for s in steps.values() if isinstance(steps, dict) else steps:
        if s.status in (StepStatus.COMPLETED, StepStatus.SKIPPED):
            ctx["steps"][s.step_id] = {"output": s.output, "status": str(s.status)}


def context(run: Run, earlier: dict[int, RunStep]) -> Context:
    """What a run's expressions see: its payload, the steps finished so far, the run."""
    ctx: Context = {
        "payload": run.payload,
        "steps": {},
        "run": {"id": run.run_id, "flow_id": run.flow_id, "trigger": run.trigger},
    }
    see(ctx, earlier)
    return ctx


async def see_branches(
    db: Database,
    run: Run,
    earlier: dict[int, RunStep],
    ctx: Context,
    *,
    idxs: list[int] | None = None,
) -> None:
    """Let later steps reach the steps of the branches of finished ``parallel`` steps (those
    at ``idxs``, or every one among ``earlier``, including those a rerun reused) as
    ``steps.<id>``."""
    if idxs is None and not any(s.type == "parallel" for s in earlier.values()):
        return
    async with db.read() as conn:
        if idxs is None:
            records = list(earlier.values())
            found = await children_store.reached_branch_steps(conn, run, records)
        else:
            found = await children_store.branch_steps(conn, run.run_id, idxs)
    for s in found:
        ctx["steps"][s.step_id] = {"output": s.output, "status": str(s.status)}


class Scopes:
    """The scopes of the parts this process runs, read once per step that started parts
    (parts claimed together share the one read), then cached by (parent row, step index):
    they do not change while the parts run."""

    def __init__(self, db: Database, size: int = 256) -> None:
        self._db = db
        self._size = size
        self._scopes: OrderedDict[tuple[str, int], asyncio.Future[Scope | None]] = OrderedDict()

    async def part_context(self, part: Run, earlier: dict[int, RunStep]) -> Scope | None:
        """The context a part's steps see (its run's payload and finished steps, those of the
        parts it is nested in with their ``item`` and ``index``, its own ``item`` and
        ``index`` in a map, its own finished steps), and when its top-level run started;
        ``None`` when a run it is part of is gone."""
        scope = await self.of(part)
        if scope is None:
            return None
        around, root_started = scope
        ctx: Context = {**around, "steps": dict(around["steps"])}
        own = part.scope or {}
        if "index" in own:
            ctx["item"], ctx["index"] = own["item"], own["index"]
        see(ctx, earlier)
        return ctx, root_started

    async def of(self, part: Run) -> Scope | None:
        assert part.parent_run_id is not None
        assert part.parent_idx is not None
        key = (part.parent_run_id, part.parent_idx)
        pending = self._scopes.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._read(part.parent_run_id))
            self._scopes[key] = pending
            if len(self._scopes) > self._size:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end(key)
        try:
            return await asyncio.shield(pending)
        except Exception:
            self._scopes.pop(key, None)  # read again next time
            raise

    async def _read(self, holder_id: str | None) -> Scope | None:
        chain: list[Run] = []
        branches: list[RunStep] = []
        async with self._db.read() as conn:
            while holder_id is not None:
                holder = await runs_store.get_run_by_id(conn, holder_id)
                if holder is None:
                    return None
                chain.append(holder)
                # what the branches of its finished parallel steps ran is in reach too
                branches += await children_store.reached_branch_steps(conn, holder, holder.steps)
                holder_id = holder.parent_run_id if holder.root_run_id is not None else None
        root = chain[-1]
        ctx = context(root, {s.idx: s for s in root.steps})
        for holder in reversed(chain[:-1]):
            see(ctx, holder.steps)
            scope = holder.scope or {}
            if "index" in scope:
                ctx["item"], ctx["index"] = scope["item"], scope["index"]
        for s in branches:
            ctx["steps"].setdefault(s.step_id, {"output": s.output, "status": str(s.status)})
        return ctx, root.started_at or root.queued_at
