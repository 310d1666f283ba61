"""``delay``: a durable sleep, ``seconds`` from now or ``until`` an ISO 8601 time (both may
be templated). The run gives its worker slot back and any process claims it again when due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Context, Outcome, StepBase, StepEnv, error

__all__ = ["DelayStep"]


class DelayStep(StepBase, kind="delay", pure=False, external=False, limited=False):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self._seconds = compile_value(spec["seconds"]) if "seconds" in spec else None
        self._until = compile_value(spec["until"]) if "until" in spec else None

    async def run(self, ctx: Context, env: StepEnv) -> Outcome:
        now = env.clock.now()
        try:
            if self._until is not None:
                text = str(await evaluate(self._until, ctx))
                due = datetime.fromisoformat(text.replace("Z", "+00:00"))
                if due.tzinfo is None:
                    due = due.replace(tzinfo=UTC)
            else:
                seconds = (
                    float(await evaluate(self._seconds, ctx)) if self._seconds is not None else 0.0
                )
                if seconds < 0:
                    return error("delay", f"seconds must not be negative, not {seconds}")
                due = now + timedelta(seconds=seconds)
        except ExpressionError as exc:
            return error("expression", str(exc))
        except (ValueError, TypeError, OverflowError) as exc:
            return error("delay", f"not a time or a number of seconds: {exc}")
        return Outcome(output={"until": isoformat(due)}, action="wait", wait_until=due)
