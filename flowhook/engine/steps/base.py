"""What every step type provides, and what a step hands back to the executor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

import aiohttp

from flowhook.clock import Clock

__all__ = ["Action", "Step", "StepBase", "Outcome", "Context", "StepEnv", "Lists", "error"]

Context = dict[str, Any]
"""What expressions see: ``payload``, ``steps`` (id → output and status) and ``run``."""


class Action(StrEnum):
    """Where a run goes after a step's attempt."""

    CONTINUE = "continue"
    """On to the next step."""
    END = "end"
    """The run ends now, completed (a ``condition``'s ``then: end``)."""
    FAIL = "fail"
    """The run fails with the outcome's error."""
    GOTO = "goto"
    """On to the later step ``target``; the steps between are skipped."""
    SUSPEND = "suspend"
    """The run sleeps in the step, holding no worker: the step is
    :class:`~flowhook.engine.durable.Suspending`, its durable half takes over."""


@dataclass(slots=True)
class Outcome:
    """A finished step attempt. ``error`` set means the step failed; ``action`` says where the
    run goes next (:class:`Action`: with ``target`` for ``goto``; with ``wait_until``, when
    the wait ends at the latest, for ``suspend``)."""

    output: Any = None
    error: dict[str, Any] | None = None
    action: Action = Action.CONTINUE
    target: str | None = None
    wait_until: datetime | None = None


def error(type_: str, message: str, **extra: Any) -> Outcome:
    return Outcome(error={"type": type_, "message": message, **extra}, action=Action.FAIL)


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
    secrets: Callable[[frozenset[str]], Awaitable[dict[str, str]]] | None = None
    """The values of those of the named step secrets the run's workspace and mode hold
    (an http step reads them as it builds its request, and only then)."""


Lists = dict[tuple[str, str | None], list["Step"]]
"""Step lists nested in a step, by (step id, branch name; ``None`` for a map's)."""


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

    def nested(self) -> Lists:
        """The step lists nested in this one (a ``parallel``'s branches, a ``map``'s steps)."""
        ...


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

    def nested(self) -> Lists:
        return {}
