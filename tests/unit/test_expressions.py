from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flowhook.definition import ExpressionError, Renderer, compile_value, evaluate
from flowhook.definition.deadline import MAX_EVAL_SECONDS, TooSlow, bounded
from flowhook.definition.sandbox import NotInline

# The watchdog's TooSlow is raised asynchronously and may land inside coverage's tracer
# callbacks, leaving their lock held for good: these tests run without coverage (the
# no_tracer marker in pyproject.toml).
pytestmark = pytest.mark.no_tracer

CTX = {"payload": {"n": 3, "items": [1, 2], "name": "Ada", "keys": "k"}, "steps": {}}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ payload.n }}", 3),
        ("{{ payload.n * 1.5 }}", 4.5),
        ("  {{ payload.items }}  ", [1, 2]),
        ("{{ payload.items | length }}", 2),
        ("{{ payload.keys }}", "k"),
        ("Hello {{ payload.name }}!", "Hello Ada!"),
        ("{{ payload.n }}{{ payload.n }}", "33"),
        ("plain", "plain"),
        ("{{ {'a': payload.n} }}", {"a": 3}),
        ("{{ payload.missing | default('none') }}", "none"),
        ("{% if payload.n > 2 %}big{% else %}small{% endif %}", "big"),
    ],
)
def test_values(source: str, expected: object) -> None:
    assert compile_value(source)(CTX) == expected


def test_nested_structures_are_templated_item_by_item() -> None:
    value = {"a": ["{{ payload.n }}", {"b": "x{{ payload.n }}"}], "c": 5, "d": None}
    assert compile_value(value)(CTX) == {"a": [3, {"b": "x3"}], "c": 5, "d": None}


@pytest.mark.parametrize(
    "source",
    [
        "{{ payload.nope }}",
        "{{ payload.nope.deeper }}",
        "{{ ''.__class__ }}",
        "{{ payload.__class__.__base__.__subclasses__() }}",
        "{{ lipsum.__globals__ }}",
        "{{ 'a' * 1000000 }}",
        "{{ [1] * 1000000 }}",
        "{{ 10 ** 100000 }}",
        "{{ range(1000000) | list }}",
        "{{ payload.items.append(3) }}",
    ],
)
def test_refused_or_failing_expressions_raise_expression_error(source: str) -> None:
    with pytest.raises(ExpressionError):
        compile_value(source)(CTX)


def test_syntax_errors_are_found_at_compile_time() -> None:
    with pytest.raises(ExpressionError):
        compile_value("{{ 1 + }}")
    with pytest.raises(ExpressionError):
        compile_value({"deep": ["{% if %}"]})


def test_a_runaway_loop_is_stopped() -> None:
    import time

    source = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(ExpressionError, match="longer than"):
        compile_value(source)(CTX)
    assert time.monotonic() - started < 5


RUNAWAY_UNDER_COVERAGE = """
from flowhook.definition import ExpressionError, compile_value
try:
    compile_value("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}")({})
except ExpressionError:
    print("stopped")
"""


def test_a_stopped_evaluation_leaves_no_exception_pending(tmp_path: Path) -> None:
    # Withdrawing a raised TooSlow with PyThreadState_SetAsyncExc(id, NULL) left CPython
    # 3.11's async-exception flag set for good: under coverage's tracer the process then
    # spun at exit for ever. The watchdog now takes a pending one instead.
    script = tmp_path / "runaway.py"
    script.write_text(RUNAWAY_UNDER_COVERAGE)
    data = tmp_path / ".coverage"
    command = [sys.executable, "-m", "coverage", "run", f"--data-file={data}", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr


def test_a_deadline_left_behind_stops_firing(monkeypatch: pytest.MonkeyPatch) -> None:
    # A thread that never calls end() (here: no such thread) is fired at _MAX_SHOTS times at
    # most, then its deadline is dropped: it cannot keep raising TooSlow in later code.
    from flowhook.definition import deadline

    monkeypatch.setattr(deadline, "MAX_EVAL_SECONDS", 0.001)
    monkeypatch.setattr(deadline, "_REPEAT", 0.001)
    gone = 1  # no thread has this id: the exception it is sent reaches nobody
    deadline._watchdog.begin(gone)
    until = time.monotonic() + 5
    while gone in deadline._watchdog._deadlines and time.monotonic() < until:
        time.sleep(0.01)
    assert gone not in deadline._watchdog._deadlines
    assert deadline._watchdog._fired.pop(gone) == deadline._MAX_SHOTS


# Each would build far more than the 100,000 cap in one library call (before: GBs).
GROWTH = [
    "{{ ('a' * 50000) | replace('a', 'bbbbb') }}",
    "{{ ('a' * 50000).replace('a', 'bbbbb') }}",
    "{{ 'a'.ljust(1000000000) }}",
    "{{ 'a'.rjust(1000000000) }}",
    "{{ 'a'.center(1000000000) }}",
    "{{ 'a'.zfill(1000000000) }}",
    "{{ 'a' | center(1000000000) }}",
    "{{ ('a\\n' * 50000) | indent(100) }}",
    "{{ ('\\t' * 50000).expandtabs(100) }}",
    "{{ ('a ' * 50000) | wordwrap(1, wrapstring='x' * 100) }}",
    "{{ '%1000000000d' % 1 }}",
    "{{ '%.1000000000f' % 1.0 }}",
    "{{ '%*d' % (1000000000, 1) }}",
    "{{ '%s%s' % ('a' * 60000, 'a' * 60000) }}",
    "{{ '{:>1000000000}'.format(1) }}",
    "{{ '{:.1000000000f}'.format(1.0) }}",
    "{{ '{x:>1000000000}'.format_map({'x': 1}) }}",
    "{{ '%2000000s' | format(1) }}",
    "{{ range(100000) | join('a' * 1000) }}",
    "{{ ('a' * 1000).join(range(100000) | map('string')) }}",
    "{{ [('a' * 100000)] * 100000 }}",
    "{{ ('a' * 60000) ~ ('a' * 60000) }}",
    "{{ ('a' * 60000) + ('a' * 60000) }}",
    "{{ [('a' * 60000)] + [('a' * 60000)] }}",
    "{% for i in range(100000) %}{{ 'a' * 100 }}{% endfor %}",
    "{{ [1] | batch(1000000000, 'x') | list }}",
    "{{ [1] | slice(1000000000) | list }}",
    "{{ [1] | batch(100000, 'x' * 100) | list }}",
    "{{ [1] | slice(100000, 'x' * 100) | list }}",
    "{{ ([('a' * 1000)] * 200) | sum(start='') }}",
    "{{ [[1] * 60000, [1] * 60000] | sum(start=[]) }}",
    "{{ 'a'.translate({97: 'b' * 100}) }}",
    "{{ (2 ** 4000) * (2 ** 4000) }}",
    "{% set s = 'a' * 100000 %}{{ [s, s] }}",
    "{% set s = 'a' * 100000 %}{{ [s, s] | tojson }}",
    "{% set s = 'a' * 100000 %}{{ [s, s] | string }}",
    "{% for i in range(200) %}{% set x = 'a' * 99999 %}{% endfor %}",
    "{{ range(100000) | map('center', 100000) | list | length }}",
    # Shared references doubling a value's printed size: printing or comparing would run
    # in C for ever.
    "{% set ns = namespace(a=1, b=2) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}"
    "{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
    "{% set ns = namespace(a=1) %}{% for i in range(60) %}{% set ns.a = (ns.a, ns.a) %}"
    "{% endfor %}{{ ns.a }}",
    "{% set ns = namespace(a=1) %}{% for i in range(60) %}{% set ns.a = {'x': ns.a, 'y': ns.a} %}"
    "{% endfor %}{{ ns.a }}",
    "{% set ns = namespace(a=1) %}{% for i in range(60) %}{% set ns.a = dict(x=ns.a, y=ns.a) %}"
    "{% endfor %}{{ ns.a }}",
    "{% set ns = namespace(a=1) %}{% for i in range(60) %}"
    "{% set ns.a = namespace(x=ns.a, y=ns.a) %}{% endfor %}{{ ns.a }}",
]


@pytest.mark.parametrize("source", GROWTH)
def test_every_growth_path_past_the_cap_is_refused_before_it_runs(source: str) -> None:
    with pytest.raises(ExpressionError, match="refused by the sandbox"):
        compile_value(source)(CTX)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ 'ab' | replace('a', 'xy') }}", "xyb"),
        ("{{ 'ab'.replace('a', 'xy') }}", "xyb"),
        ("{{ 'x'.ljust(3) ~ '|' }}", "x  |"),
        ("{{ 'x' | center(3) }}", " x "),
        ("{{ '%05d' % 3 }}", "00003"),
        ("{{ '%(a)s-%(b)s' % {'a': 1, 'b': 2} }}", "1-2"),
        ("{{ '{:>4}'.format(1) }}", "   1"),
        ("{{ '{a}'.format_map({'a': 5}) }}", "5"),
        ("{{ [1, 2] | join(',') }}", "1,2"),
        ("{{ ', '.join(['a', 'b']) }}", "a, b"),
        ("{{ ('a' * 100000) | length }}", 100000),
        ("{{ ([1] * 100000) | length }}", 100000),
        ("{{ [[1], [2]] | sum(start=[]) }}", [1, 2]),
        ("{{ [1, 2, 3] | batch(2, 0) | list }}", [[1, 2], [3, 0]]),
        ("{{ 'a\nb' | indent(2) }}", "a\n  b"),
        ("{{ 2 ** 10 * 3 }}", 3072),
        ("{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}", "37"),
        ("{% set a, b = 1, 2 %}{{ a ~ b }}", "12"),
        ("{{ {'a': [1, (2, 3)]} }}", {"a": [1, (2, 3)]}),
        ("{{ dict(a=1) }}", {"a": 1}),
    ],
)
def test_growth_within_the_cap_still_works(source: str, expected: object) -> None:
    assert compile_value(source)(CTX) == expected


def test_lipsum_is_gone() -> None:
    for source in ("{{ lipsum(8000) | length }}", "{{ lipsum }}"):
        with pytest.raises(ExpressionError, match="there is no 'lipsum' here"):
            compile_value(source)(CTX)


@pytest.mark.parametrize(
    ("value", "inline"),
    [
        (
            {"x": "{{ payload.n + 1 }}", "y": ["{{ steps.a.output.x * 2 }}", "text {{ run.id }}"]},
            True,
        ),
        ("{{ payload.items | map('upper') | list }}", False),
        ("{% for i in payload.items %}{{ i }}{% endfor %}", False),
        ("{{ 'x'.ljust(3) }}", False),
        ({"a": "{{ payload.n }}", "b": "{{ range(3) | list }}"}, False),
    ],
)
def test_only_small_expressions_of_cheap_parts_run_in_place(value: object, inline: bool) -> None:
    assert compile_value(value).inline is inline


def test_a_long_expression_of_cheap_parts_does_not_run_in_place() -> None:
    assert not compile_value("{{ " + " + ".join(["payload.n"] * 25) + " }}").inline  # 74 nodes


async def test_in_place_only_over_a_small_context_and_small_builds() -> None:
    in_loop = threading.get_ident()
    where = compile_value("{{ payload.n }}")
    assert where.inline
    big = {"payload": {"n": 1, "pad": "x" * 10_000}}
    growing = compile_value("{{ ('a' * 20000) | length }}")  # builds more than in place may
    assert growing.inline
    for renderer, ctx, expected in ((where, CTX, 3), (where, big, 1), (growing, CTX, 20000)):
        assert renderer(ctx) == expected
        assert await evaluate(renderer, ctx) == expected
    with pytest.raises(NotInline):
        where.in_place(big)
    with pytest.raises(NotInline):
        growing.in_place(CTX)
    assert where.in_place(CTX) == 3
    assert threading.get_ident() == in_loop


def test_the_bound_stops_library_code_too() -> None:
    # The old tracer only saw template frames: a long library call outlived the bound.
    def spin() -> None:
        while True:
            pass

    started = time.monotonic()
    with pytest.raises(TooSlow):
        bounded(spin)
    assert time.monotonic() - started < MAX_EVAL_SECONDS + 4


async def test_slow_expressions_run_off_the_event_loop_and_the_thread_stays_usable() -> None:
    slow = compile_value(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    assert not slow.inline
    loop_thread = threading.get_ident()
    seen: list[int] = []
    probe = compile_value("{{ payload.n | string | list | length }}")
    probe.inline = False  # force it through the expression thread, to see where it runs
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        for _ in range(2):
            with pytest.raises(ExpressionError, match="longer than 1 s"):
                await evaluate(slow, CTX)
            seen.append(await evaluate(probe, CTX))
    finally:
        ticker.cancel()
    assert seen == [1, 1]  # after a stopped evaluation the next one runs normally
    assert ticks > 10  # the loop kept running while the expressions did
    assert threading.get_ident() == loop_thread


async def test_stopping_at_the_deadline_never_leaks_into_the_next_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A bound of 2 ms makes evaluations end right around their deadline, where the
    # watchdog's exception could otherwise arrive after its evaluation finished.
    from flowhook.definition import deadline

    monkeypatch.setattr(deadline, "MAX_EVAL_SECONDS", 0.002)
    monkeypatch.setattr(deadline, "_REPEAT", 0.001)
    loops = [
        compile_value(
            "{% for i in range(" + str(n) + ") %}{% for j in range(100) %}{% endfor %}{% endfor %}x"
        )
        for n in (1, 10, 30, 100, 300, 1000, 100_000)  # the last always outlasts 2 ms
    ]
    probe = compile_value("{{ 'ok' | upper }}")
    probe.inline = False
    outcomes: list[str] = []

    async def in_thread(renderer: Renderer) -> str:
        return str(await evaluate(renderer, CTX))

    async def here(renderer: Renderer) -> str:
        return str(renderer(CTX))

    for i in range(300):
        for run, renderer in ((in_thread, loops[i % len(loops)]), (here, loops[i % len(loops)])):
            try:
                outcomes.append(await run(renderer))
            except ExpressionError as exc:
                outcomes.append(str(exc))
        try:  # a trivial one may time out too on a busy machine, but nothing else
            outcomes.append(await in_thread(probe))
        except ExpressionError as exc:
            outcomes.append(str(exc))
    assert all(o in ("x", "OK") or o.endswith("took longer than 0.002 s") for o in outcomes)
    assert "x" in outcomes and any(o.endswith("0.002 s") for o in outcomes)
    monkeypatch.undo()  # the normal bound: nothing is left pending in either thread
    for _ in range(20):
        assert await evaluate(probe, CTX) == "OK"
        assert probe(CTX) == "OK"


def test_saving_caps_length_and_nesting() -> None:
    from flowhook.definition.expressions import (
        MAX_EXPRESSION_CHARS,
        MAX_EXPRESSION_DEPTH,
        check_size,
    )

    check_size({"v": "{{ " + " + ".join(["1"] * (MAX_EXPRESSION_DEPTH - 2)) + " }}"})  # within
    deep = "{{ " + " + ".join(["1"] * 150) + " }}"
    with pytest.raises(ExpressionError, match=f"nests deeper than {MAX_EXPRESSION_DEPTH}"):
        check_size([deep])
    long = "{{ '" + "x" * MAX_EXPRESSION_CHARS + "' }}"
    with pytest.raises(ExpressionError, match=f"more than the {MAX_EXPRESSION_CHARS}"):
        check_size({"a": {"b": long}})
    check_size("x" * (MAX_EXPRESSION_CHARS * 2))  # no expression in it: no cap
    assert compile_value(deep)({}) == 150  # a flow saved before the caps still runs


def test_a_string_is_compiled_once_per_process() -> None:
    from flowhook.definition import expressions

    source = "{{ payload.once_only_" + str(id(object())) + " }}"
    before = expressions._compile_string.cache_info()
    compile_value({"a": source})  # the definition's check when it is saved
    compile_value([source])  # the engine's compile of its first run
    after = expressions._compile_string.cache_info()
    assert after.misses == before.misses + 1 and after.hits >= before.hits + 1
