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

__all__ = ["MAX_EVAL_SECONDS", "TooSlow", "bounded", "in_thread"]

MAX_EVAL_SECONDS = 1.0
"""Longest one evaluation may run; past it the evaluation is stopped."""

_REPEAT = 0.05
T = TypeVar("T")


class TooSlow(BaseException):
    """An evaluation ran past its deadline."""


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}
        """Thread id -> when its evaluation must stop."""
        self._fired: set[int] = set()
        self._idle = True
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, tid: int) -> None:
        with self._lock:
            self._deadlines[tid] = time.monotonic() + MAX_EVAL_SECONDS
            self._fired.discard(tid)
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
            fired = tid in self._fired
            self._fired.discard(tid)
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
                        self._fired.add(tid)
                        self._deadlines[tid] = now + _REPEAT
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


def bounded(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` stopped with :class:`TooSlow` after :data:`MAX_EVAL_SECONDS` (a call
    inside a bounded one shares its bound)."""
    if getattr(_nesting, "on", False):
        return fn(*args)
    tid = threading.get_ident()
    _nesting.on = True
    _watchdog.begin(tid)
    try:
        try:
            return fn(*args)
        finally:
            _watchdog.end(tid)
    except TooSlow:
        _watchdog.end(tid)  # it may have come while ending: end for sure (idempotent)
        raise
    finally:
        _nesting.on = False


_pool: ThreadPoolExecutor | None = None


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` in the process's expression thread, the event loop free meanwhile."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowhook-expr")
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)
