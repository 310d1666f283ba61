"""Functions that ``python`` steps may call: registered with :func:`step` in modules named in
``FLOWHOOK_PLUGINS``. Nothing unregistered is callable."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["step", "StepContext", "registered", "load_plugins"]

F = TypeVar("F", bound=Callable[..., Any])
_REGISTRY: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a registered function receives."""

    payload: dict[str, Any]
    steps: dict[str, Any]
    """Earlier steps' outputs, by step id."""
    input: Any
    """The step's ``input`` value, evaluated."""
    run_id: str
    flow_id: str
    step_id: str
    attempt: int
    extra: dict[str, Any] = field(default_factory=dict)


def step(name: str) -> Callable[[F], F]:
    """Register a function, sync or async, taking a :class:`StepContext` and returning
    JSON-able data, under ``name`` for ``{"type": "python", "function": name}`` steps."""

    def register(fn: F) -> F:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"python step {name!r} is registered twice")
        _REGISTRY[name] = fn
        return fn

    return register


def registered(name: str) -> Callable[..., Any] | None:
    return _REGISTRY.get(name)


def load_plugins(modules: list[str]) -> None:
    """Import each module so its ``@flowhook.step`` functions register."""
    for module in modules:
        importlib.import_module(module)
