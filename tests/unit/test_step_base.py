"""StepBase: what each step type reads from its spec (id, timeout_seconds, retry) and the
kind and flags its class line gives."""

from __future__ import annotations

from flowhook.engine.steps import build_step

RETRY = {"max_attempts": 3}


def spec(kind: str, **own: object) -> dict[str, object]:
    return {"id": "s", "type": kind, "timeout_seconds": 5, "retry": RETRY, **own}


def test_limited_steps_read_timeout_and_retry() -> None:
    for s in (
        spec("transform", output={}),
        spec("condition", **{"if": True}),
        spec("python", function="f"),
    ):
        step = build_step(s)
        assert (step.id, step.type, step.timeout, step.retry) == ("s", s["type"], 5, RETRY)


def test_delay_and_fail_ignore_timeout_and_retry() -> None:
    for s in (spec("delay", seconds=1), spec("fail")):
        step = build_step(s)
        assert (step.id, step.type, step.timeout, step.retry) == ("s", s["type"], None, None)


def test_kinds_and_flags() -> None:
    flags = {
        kind: (step.pure, step.external)
        for kind, step in (
            ("transform", build_step(spec("transform", output={}))),
            ("condition", build_step(spec("condition", **{"if": True}))),
            ("python", build_step(spec("python", function="f"))),
            ("delay", build_step(spec("delay", seconds=1))),
            ("fail", build_step(spec("fail"))),
            ("http", build_step(spec("http", request={"url": "http://x"}))),
        )
    }
    assert flags == {
        "transform": (True, False),
        "condition": (True, False),
        "python": (False, True),
        "delay": (False, False),
        "fail": (True, False),
        "http": (False, True),
    }
