"""What every step type provides, and what a step hands back to the executor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import aiohttp

from flowhook.clock import Clock

__all__ = ["Step", "StepBase", "Outcome", "Context", "StepEnv", "error"]

Context = dict[str, Any]
"""What expressions see: ``payload``, ``steps`` (id → output and status) and ``run``."""


@dataclass(slots=True)
class Outcome:
    """A finished step. ``error`` set means the step failed; ``action`` says where to go next:
    ``continue``, ``end``, ``fail``, ``goto`` (with ``target``) or ``wait`` (until
    ``wait_until``, releasing the worker)."""

    output: Any = None
    error: dict[str, Any] | None = None
    action: str = "continue"
    target: str | None = None
    wait_until: datetime | None = None


def error(type_: str, message: str, **extra: Any) -> Outcome:
    return Outcome(error={"type": type_, "message": message, **extra}, action="fail")


@dataclass(frozen=True, slots=True)
class StepEnv:
    """What a step may use besides the expression context."""

    clock: Clock
    http: aiohttp.ClientSession | None
    allow_private_targets: bool
    run_id: str
    flow_id: str
    attempt: int
    max_map_items: int = 1000
    """``FLOWHOOK_MAX_MAP_ITEMS``: the longest list a ``map`` step takes."""
    row_id: str = ""
    """The run row the step runs in (a part's own id, unlike ``run_id``), and the step's
    index there: with ``attempt`` they name the attempt's span (:mod:`flowhook.tracing`)."""
    idx: int = 0
    traceparent: str | None = None
    """The run row's stored trace context (``None``: derived from ``row_id``)."""
    span: dict[str, Any] | None = None
    """Attributes a step adds to its span; a dict only while spans are exported."""


class Step(Protocol):
    id: str
    type: str
    pure: bool
    """A pure step gives the same result when run again, so its result may be committed
    together with the steps after it."""
    external: bool
    """A step with effects outside (``http``, ``python``): the start of each attempt is
    committed before it runs, so an attempt a crash interrupts shows in the run's record."""
    timeout: float | None
    retry: dict[str, Any] | None

    async def run(self, ctx: Context, env: StepEnv) -> Outcome: ...


class StepBase:
    """What every step type reads from its spec besides its own fields: ``id``, and
    ``timeout_seconds`` and ``retry`` unless the type is made with ``limited=False``
    (``delay`` and ``fail`` run no attempt that could time out or be retried, and ignore
    them). A type names its kind and flags in its class line:
    ``class TransformStep(StepBase, kind="transform", pure=True, external=False)``."""

    type: str
    pure: bool
    external: bool
    limited: bool

    def __init_subclass__(
        cls, *, kind: str, pure: bool, external: bool, limited: bool = True, **kw: Any
    ) -> None:
        super().__init_subclass__(**kw)
        cls.type, cls.pure, cls.external, cls.limited = kind, pure, external, limited

    def __init__(self, spec: dict[str, Any]) -> None:
        self.id: str = spec["id"]
        self.timeout: float | None = spec.get("timeout_seconds") if self.limited else None
        self.retry: dict[str, Any] | None = spec.get("retry") if self.limited else None
