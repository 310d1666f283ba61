"""Flow control as a flow definition states it: ``concurrency``, ``throttle``, ``debounce``
and ``priority``, compiled once per flow version, with the timing rules they follow.

The keys are expressions read against the payload when a run is accepted (an error there
answers 400 naming the field); what they give is stored with the run, and the store holds
the runs back (:mod:`flowhook.store.control`). The rules here are pure functions of the
times they are given, so they are tested on a fake clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from flowhook.definition.expressions import ExpressionError, Renderer, compile_value, evaluate
from flowhook.errors import InvalidInput

__all__ = [
    "FlowControl",
    "Keys",
    "MAX_KEY_LENGTH",
    "KEY_SECONDS",
    "PRIORITY_RANGE",
    "throttle_start",
    "debounce_due",
    "check_priority",
]

MAX_KEY_LENGTH = 255
KEY_SECONDS = 0.25
"""Longest one flow-control key (or priority) may take to evaluate: keys are read when a run
is accepted, before the execute answers, so they get a budget of their own, far below a
step's second."""
PRIORITY_RANGE = (-100, 100)


def throttle_start(
    latest: Sequence[datetime], limit: int, period: float, now: datetime
) -> datetime:
    """When a run may start under a throttle of ``limit`` starts per ``period`` seconds, given
    the starts already reserved for its key, latest first (at most ``limit`` of them): at once
    while fewer than ``limit`` were reserved, otherwise one period after the ``limit``-th
    latest. So no window of ``period`` seconds holds more than ``limit`` starts, and a burst
    is spread at the pace the throttle allows, in the order its runs were admitted."""
    if len(latest) < limit:
        return now
    return max(now, latest[limit - 1] + timedelta(seconds=period))


def debounce_due(first: datetime, now: datetime, period: float, max_wait: float | None) -> datetime:
    """When a debounced run starts: ``period`` after the last execute that joined it (``now``),
    but no later than ``max_wait`` after the first (``first``)."""
    due = now + timedelta(seconds=period)
    if max_wait is not None:
        due = min(due, first + timedelta(seconds=max_wait))
    return due


def debounce_open(first: datetime, now: datetime, max_wait: float | None) -> bool:
    """Whether a debounced run accepted at ``first`` may still take an execute at ``now``."""
    return max_wait is None or now < first + timedelta(seconds=max_wait)


def check_priority(value: Any, field: str) -> int:
    """A priority as given (by the execute body or the flow's expression), checked."""
    low, high = PRIORITY_RANGE
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise InvalidInput(f"{field} must be an integer from {low} to {high}, not {value!r}",
                           field=field)  # fmt: skip
    if not low <= int(value) <= high:
        raise InvalidInput(f"{field} must be from {low} to {high}, not {int(value)}", field=field)
    return int(value)


@dataclass(frozen=True, slots=True)
class Keys:
    """What flow control stores with an accepted run."""

    priority: int = 0
    concurrency_key: str | None = None
    throttle_key: str | None = None
    debounce_key: str | None = None


@dataclass(frozen=True, slots=True)
class _Key:
    field: str
    renderer: Renderer | None  # None: one key for the whole flow ("")

    async def read(self, ctx: dict[str, Any]) -> str:
        if self.renderer is None:
            return ""
        try:
            value = await evaluate(self.renderer, ctx, seconds=KEY_SECONDS)
        except ExpressionError as exc:
            raise InvalidInput(f"{self.field}: {exc}", field=self.field) from None
        if value is None or value == "" or isinstance(value, dict | list):
            raise InvalidInput(
                f"{self.field} must give a string or a number for this payload, not {value!r}",
                field=self.field,
            )
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if len(text) > MAX_KEY_LENGTH:
            raise InvalidInput(
                f"{self.field} gave a key of {len(text)} characters (at most {MAX_KEY_LENGTH})",
                field=self.field,
            )
        return text


def _key(spec: dict[str, Any], field: str) -> _Key:
    return _Key(f"{field}.key", compile_value(spec["key"]) if "key" in spec else None)


@dataclass(frozen=True, slots=True)
class FlowControl:
    """A flow version's flow control, compiled."""

    concurrency: int | None = None
    concurrency_key: _Key | None = None
    throttle_limit: int = 0
    throttle_period: float = 0.0
    throttle_key: _Key | None = None
    debounce_period: float = 0.0
    debounce_max_wait: float | None = None
    debounce_key: _Key | None = None
    priority: int = 0
    priority_expression: Renderer | None = None

    @property
    def admits(self) -> bool:
        """Whether a queued run must be admitted (a slot, a reserved start) before it starts."""
        return self.concurrency is not None or self.throttle_limit > 0

    @classmethod
    def build(cls, definition: dict[str, Any]) -> FlowControl | None:
        """``None`` for a flow with none of it (the common case, which costs nothing)."""
        if not any(k in definition for k in ("concurrency", "throttle", "debounce", "priority")):
            return None
        values: dict[str, Any] = {}
        concurrency = definition.get("concurrency")
        if isinstance(concurrency, int):
            values["concurrency"] = concurrency
            values["concurrency_key"] = _Key("concurrency.key", None)
        elif isinstance(concurrency, dict):
            values["concurrency"] = concurrency["limit"]
            values["concurrency_key"] = _key(concurrency, "concurrency")
        if "throttle" in definition:
            throttle = definition["throttle"]
            values["throttle_limit"] = throttle["limit"]
            values["throttle_period"] = float(throttle["period_seconds"])
            values["throttle_key"] = _key(throttle, "throttle")
        if "debounce" in definition:
            debounce = definition["debounce"]
            values["debounce_period"] = float(debounce["period_seconds"])
            wait = debounce.get("max_wait_seconds")
            values["debounce_max_wait"] = None if wait is None else float(wait)
            values["debounce_key"] = _key(debounce, "debounce")
        priority = definition.get("priority", 0)
        if isinstance(priority, str):
            values["priority_expression"] = compile_value(priority)
        else:
            values["priority"] = priority
        return cls(**values)

    async def keys(self, payload: dict[str, Any], priority: int | None) -> Keys:
        """The keys of a run accepted with ``payload`` (and the execute body's ``priority``,
        which wins over the flow's); raises :class:`InvalidInput` naming the field."""
        ctx = {"payload": payload}
        if priority is None:
            if self.priority_expression is not None:
                try:
                    value = await evaluate(self.priority_expression, ctx, seconds=KEY_SECONDS)
                except ExpressionError as exc:
                    raise InvalidInput(f"priority: {exc}", field="priority") from None
                priority = check_priority(value, "priority")
            else:
                priority = self.priority
        return Keys(
            priority=priority,
            concurrency_key=None if self.concurrency_key is None
            else await self.concurrency_key.read(ctx),
            throttle_key=None if self.throttle_key is None else await self.throttle_key.read(ctx),
            debounce_key=None if self.debounce_key is None else await self.debounce_key.read(ctx),
        )  # fmt: skip
