"""What every step type provides, and what a step hands back to the executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Step", "Outcome", "Context"]

Context = dict[str, Any]
"""What expressions see: ``payload``, ``steps`` (id → output and status) and ``run``."""


@dataclass(slots=True)
class Outcome:
    """A finished step. ``error`` set means the step failed; ``action`` says where to go next:
    ``continue``, ``end``, ``fail`` or ``goto`` (with ``target``)."""

    output: Any = None
    error: dict[str, Any] | None = None
    action: str = "continue"
    target: str | None = None


class Step(Protocol):
    id: str
    type: str
    pure: bool
    """A pure step gives the same result when run again, so its result may be committed
    together with the steps after it."""

    async def run(self, ctx: Context) -> Outcome: ...
