"""The time bound of an evaluation, and the thread evaluations run in.

A watchdog thread raises :class:`TooSlow` asynchronously in a thread whose evaluation is
past its deadline; Python delivers it between two bytecodes, in template code or in library
code alike (the sandbox keeps each library call short, so it comes promptly). It costs an
evaluation two lock round trips, not a tracer's call per line. It is a BaseException, so
an ``except Exception`` in library code does not swallow it, and it is raised again every
:data:`_REPEAT` seconds until the evaluation ends.

Evaluations that may run long go to one thread per process (:func:`in_thread`), so the
event loop that serves the API keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["MAX_EVAL_SECONDS", "TooSlow", "bounded", "current_bound", "in_thread"]

MAX_EVAL_SECONDS = 1.0
"""Longest one evaluation may run; past it the evaluation is stopped."""

_REPEAT = 0.05
_MAX_SHOTS = 100
"""Times one evaluation's TooSlow is raised (every :data:`_REPEAT` s past its deadline) before
the watchdog gives up on it: a deadline left behind can never keep firing at its thread."""
T = TypeVar("T")


class TooSlow(BaseException):
    """An evaluation ran past its deadline."""


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}
        """Thread id -> when its evaluation must stop."""
        self._fired: dict[int, int] = {}
        """Thread id -> how many times TooSlow was raised for its evaluation."""
        self._idle = True
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, tid: int, seconds: float | None = None) -> None:
        with self._lock:
            bound = MAX_EVAL_SECONDS if seconds is None else seconds
            self._deadlines[tid] = time.monotonic() + bound
            self._fired.pop(tid, None)
            idle, self._idle = self._idle, False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="flowhook-expr-watchdog", daemon=True
                )
                self._thread.start()
        if idle:
            self._wake.set()

    def end(self, tid: int) -> None:
        """The evaluation in thread ``tid`` (the calling thread) is over: no more
        :class:`TooSlow` for it, and one raised but not delivered yet is taken here."""
        with self._lock:
            self._deadlines.pop(tid, None)
            fired = self._fired.pop(tid, 0) > 0
        if not fired:
            return
        # A TooSlow may still be pending for this thread. It is not withdrawn with
        # PyThreadState_SetAsyncExc(tid, NULL): on CPython 3.11 that leaves the interpreter's
        # "async exception pending" flag set for good, so every thread takes the eval loop's
        # slow path at every call and loop from then on (and a traced thread, under coverage,
        # spins at a function's first instruction). Instead one is raised again here (the
        # same exception, now surely pending) and taken at the loop's next check; the
        # watchdog fires no more for this thread, so nothing is left pending after it.
        try:
            while True:
                _set_async_exc(ctypes.c_ulong(tid), ctypes.py_object(TooSlow))
                for _ in range(2):
                    pass
        except TooSlow:
            pass

    def _watch(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                for tid, deadline in list(self._deadlines.items()):
                    if deadline <= now:
                        _set_async_exc(ctypes.c_ulong(tid), ctypes.py_object(TooSlow))
                        shots = self._fired[tid] = self._fired.get(tid, 0) + 1
                        if shots < _MAX_SHOTS:
                            self._deadlines[tid] = now + _REPEAT
                        else:
                            del self._deadlines[tid]
                due = min(self._deadlines.values(), default=None)
                if due is None:
                    self._idle = True
                    self._wake.clear()
            if due is None:
                self._wake.wait()
            else:
                time.sleep(max(0.0, due - now))


_watchdog = _Watchdog()
_nesting = threading.local()


def bounded(fn: Callable[..., T], *args: Any, seconds: float | None = None) -> T:
    """``fn(*args)`` stopped with :class:`TooSlow` after ``seconds`` (default
    :data:`MAX_EVAL_SECONDS`; a call inside a bounded one shares its bound)."""
    if getattr(_nesting, "on", False):
        return fn(*args)
    tid = threading.get_ident()
    try:
        _nesting.on = True
        _nesting.seconds = MAX_EVAL_SECONDS if seconds is None else seconds
        _watchdog.begin(tid, _nesting.seconds)
        try:
            return fn(*args)
        finally:
            # Until one end() completes: the watchdog fires again every _REPEAT s until end()
            # pops the deadline, so a TooSlow may arrive on the way in; it is dropped here (a
            # result fn already returned stands) and end() runs again.
            while True:
                try:
                    _watchdog.end(tid)
                    break
                except TooSlow:
                    pass
    finally:
        _nesting.on = False


def current_bound() -> float:
    """The bound of the evaluation running in this thread (for its error message)."""
    return float(getattr(_nesting, "seconds", MAX_EVAL_SECONDS))


_pool: ThreadPoolExecutor | None = None


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in the process's expression thread, the event loop free meanwhile."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowhook-expr")
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)
