"""``delay``: a durable sleep, ``seconds`` from now or ``until`` an ISO 8601 time (both may
be templated). The run gives its worker slot back and any process claims it again when due:
the step's record says ``waiting`` with its ``until`` meanwhile."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from flowhook.clock import isoformat
from flowhook.definition import ExpressionError, compile_value, evaluate
from flowhook.engine.steps.base import Action, Context, Outcome, StepBase, StepEnv, error
from flowhook.events import elapsed_ms
from flowhook.store.models import RunStatus, RunStep, StepStatus

if TYPE_CHECKING:
    from flowhook.engine.durable import Attempt, Cursor

__all__ = ["DelayStep", "parse_time"]


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
        return Outcome(output={"until": isoformat(due)}, action=Action.SUSPEND, wait_until=due)

    async def park(self, cur: Cursor, attempt: Attempt, outcome: Outcome) -> RunStatus | None:
        """Sleep until the time given (or the run's own time is up)."""
        assert outcome.wait_until is not None
        cur.add(attempt.waiting(outcome.output))
        return await cur.sleep_until(min(outcome.wait_until, cur.deadline))

    async def wake(self, cur: Cursor, prior: RunStep, now: datetime) -> RunStatus | None:
        """Done once its time has come; before that the run sleeps again."""
        until = parse_time(prior.output["until"])
        if now < until:
            return await cur.sleep_until(min(until, cur.deadline))
        duration = elapsed_ms(prior.started_at or now, now)
        ended = replace(prior, status=StepStatus.COMPLETED, finished_at=now, duration_ms=duration)
        # its record says when it ends: a crash before the next commit finds it done again
        return await cur.done(self, ended, Outcome(), durable=True)


def parse_time(text: str) -> datetime:
    """A time the engine wrote in a step's output (ISO 8601, ``Z`` for UTC)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
