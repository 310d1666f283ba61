"""Flow versions as the engine runs them: compiled once, kept in one cache per process."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flowhook.definition import Renderer, compile_value
from flowhook.definition.control import FlowControl
from flowhook.engine.steps import Step, build_step
from flowhook.engine.steps.base import Lists
from flowhook.store import flows as flows_store
from flowhook.store.db import Database

if TYPE_CHECKING:
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["CompiledFlow", "FlowCache", "DEFAULT_RUN_TIMEOUT"]

DEFAULT_RUN_TIMEOUT = 3600.0


@dataclass(slots=True)
class CompiledFlow:
    steps: list[Step]
    output: Renderer | None
    timeout: float
    control: FlowControl | None
    """The flow's flow control (``None``: none, nothing to admit)."""
    lists: Lists = field(default_factory=dict)
    """The step lists nested in ``parallel`` and ``map`` steps, by (step id, branch name)."""

    @classmethod
    def build(cls, definition: dict[str, Any]) -> CompiledFlow:
        steps = [build_step(spec) for spec in definition["steps"]]
        output = compile_value(definition["output"]) if "output" in definition else None
        timeout = float(definition.get("timeout_seconds", DEFAULT_RUN_TIMEOUT))
        compiled = cls(steps, output, timeout, FlowControl.build(definition))
        compiled._index(steps)
        return compiled

    def _index(self, steps: list[Step]) -> None:
        for step in steps:
            for key, nested in step.nested().items():
                self.lists[key] = nested
                self._index(nested)

    def part(self, scope: dict[str, Any]) -> CompiledFlow | None:
        """What a part runs: the list of its branch or of its map's steps (no output, no
        cap of its own); ``None`` when this version has no such list."""
        steps = self.lists.get((scope["step"], scope.get("branch")))
        if steps is None:
            return None
        return CompiledFlow(steps, None, self.timeout, None, self.lists)


async def build(definition: dict[str, Any]) -> CompiledFlow:
    """A flow version compiled off the event loop: its expressions may take a second to
    compile (bounded when it was saved), and the runs of every other flow go on meanwhile. In
    the process that saved it the compiled expressions are remembered, so this is quick."""
    return await asyncio.to_thread(CompiledFlow.build, definition)


class FlowCache:
    """The flow versions this process compiled (the most recently used ``size`` of them), and
    each flow's latest version, read again at most once a second."""

    def __init__(self, db: Database, size: int = 1024) -> None:
        self._db = db
        self._size = size
        self._flows: OrderedDict[tuple[str, int], CompiledFlow] = OrderedDict()
        self._latest: dict[str, tuple[int, float]] = {}

    def put(self, flow_id: str, version: int, compiled: CompiledFlow) -> None:
        self._flows[(flow_id, version)] = compiled
        self._flows.move_to_end((flow_id, version))
        if len(self._flows) > self._size:
            self._flows.popitem(last=False)

    async def get(self, flow_id: str, version: int) -> CompiledFlow | None:
        """The version compiled; ``None`` when it is not stored."""
        compiled = self._flows.get((flow_id, version))
        if compiled is not None:
            self._flows.move_to_end((flow_id, version))
            return compiled
        async with self._db.read() as conn:
            definition = await flows_store.get_definition(conn, flow_id, version)
        return None if definition is None else await self._build(flow_id, version, definition)

    async def latest(self, conn: AsyncConnection, flow_id: str) -> CompiledFlow | None:
        """The flow's latest version (read in ``conn``'s transaction when it is due), which
        every admission and end obeys: a new concurrency limit applies within a second."""
        seen = self._latest.get(flow_id)
        if seen is not None and seen[1] > time.monotonic():
            version: int | None = seen[0]
        else:
            version = await flows_store.current_version(conn, flow_id)
            if version is not None:
                self._latest[flow_id] = (version, time.monotonic() + 1.0)
                if len(self._latest) > self._size:
                    self._latest.pop(next(iter(self._latest)))
        if version is None:
            return None
        return self._flows.get((flow_id, version)) or await self._load(conn, flow_id, version)

    async def _load(self, conn: AsyncConnection, flow_id: str, version: int) -> CompiledFlow | None:
        definition = await flows_store.get_definition(conn, flow_id, version)
        return None if definition is None else await self._build(flow_id, version, definition)

    async def _build(self, flow_id: str, version: int, definition: dict[str, Any]) -> CompiledFlow:
        compiled = await build(definition)
        self.put(flow_id, version, compiled)
        return compiled
