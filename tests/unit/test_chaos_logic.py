"""The chaos soak's bookkeeping (bench/chaos.py): which fault explains a repeat, when the
kills fall, and the accept windows around a restart."""

from __future__ import annotations

import random

from bench.chaos import (
    Call,
    DbState,
    Fault,
    Request,
    duplicate_webhooks,
    explain,
    kill_times,
    repeated_effects,
    windows,
)


def test_a_kill_of_the_caller_while_its_step_was_in_flight_explains_a_repeat() -> None:
    kill = Fault("kill", at=10.5, until=10.6, pid=7, role="worker-1")
    assert explain(10.0, 7, 14.0, [kill], window=2.0) is kill
    assert explain(10.55, 7, 14.0, [kill], window=2.0) is kill  # reached the target just after


def test_a_kill_of_another_process_or_too_late_explains_nothing() -> None:
    kill = Fault("kill", at=10.5, until=10.6, pid=8, role="worker-2")
    assert explain(10.0, 7, 14.0, [kill], window=2.0) is None  # not the caller
    late = Fault("kill", at=13.0, until=13.1, pid=7, role="worker-1")
    assert explain(10.0, 7, 14.0, [late], window=2.0) is None  # the step had long finished
    before = Fault("kill", at=9.0, until=9.1, pid=7, role="worker-1")
    assert explain(10.0, 7, 14.0, [before], window=2.0) is None  # before the call
    after_repeat = Fault("kill", at=10.8, until=10.9, pid=7, role="worker-1")
    assert explain(10.0, 7, 10.7, [after_repeat], window=2.0) is None  # after the repeat


def test_a_postgresql_restart_explains_a_repeat_of_any_process() -> None:
    restart = Fault("pg_restart", at=20.0, until=22.0)
    assert explain(19.5, 7, 30.0, [restart], window=2.0) is restart
    assert explain(21.0, None, 30.0, [restart], window=2.0) is restart  # the store was down
    assert explain(23.0, 7, 30.0, [restart], window=2.0) is None


def test_an_unknown_caller_is_matched_to_any_kill() -> None:
    kill = Fault("kill", at=10.5, until=10.6, pid=8, role="worker-2")
    assert explain(10.0, None, 14.0, [kill], window=2.0) is kill


def test_kills_spread_over_the_load_and_away_from_the_restart() -> None:
    for seed in range(50):
        times = kill_times(30, 3, random.Random(seed), avoid=15.0)
        assert len(times) == 3
        assert times == sorted(times)
        assert all(3 <= t <= 27 and abs(t - 15.0) >= 2.5 for t in times)


def test_windows_before_and_after_a_restart() -> None:
    requests = [Request(t / 10, accepted_at=t / 10 + 0.1, run_id=f"r{t}") for t in range(300)]
    out = windows(requests, restart=15.0, end=30.0)
    assert [(w["from"], w["to"]) for w in out] == [(-10, 0), (0, 5), (5, 10), (10, 15)]
    assert out[0]["accepted_per_s"] == 10.0
    assert out[1]["median_s"] == 0.1


def test_a_run_the_engine_dropped_is_never_explained() -> None:
    kill = Fault("kill", at=10.5, until=10.6, pid=7, role="worker-1")
    calls = {"run_a": [Call(10.0, 7), Call(14.0, 8)], "run_b": [Call(10.0, 7), Call(14.0, 8)]}
    out = repeated_effects(calls, [kill], window=5.0, dropped={"run_b"})
    assert [(r["id"], r["explained_by"] is not None) for r in out] == [
        ("run_a", True),
        ("run_b", False),
    ]


def test_a_duplicate_webhook_is_explained_by_a_timeout_or_a_cut_attempt_and_a_kill() -> None:
    kill = Fault("kill", at=30.0, until=30.2, pid=7, role="serve")
    hooks = {
        "evt_timeout": [Call(10.0, 7, attempt=1), Call(40.0, 9, attempt=2)],
        "evt_cut": [Call(10.0, 7, attempt=1), Call(40.0, 9, attempt=1)],
        "evt_finished": [Call(10.0, 7, attempt=1), Call(40.0, 9, attempt=1)],
        "evt_once": [Call(10.0, 7, attempt=1)],
    }
    state = DbState({}, 0, 0, 1, {}, {"evt_timeout": {1}}, {"evt_cut": {1}})
    out = {d["id"]: d["explained_by"] for d in duplicate_webhooks(hooks, [kill], state)}
    assert out["evt_timeout"]["kind"] == "retry_after_timeout"
    assert out["evt_cut"]["kind"] == "kill"  # sent, never finished, its sender killed
    assert out["evt_finished"] is None  # finished by its sender, yet sent again: a defect
    assert "evt_once" not in out
    assert duplicate_webhooks(hooks, [], state)[0]["explained_by"] is None  # cut, no fault
