"""Request slots of one endpoint: how many of its webhooks a dispatcher sends at once.

An endpoint starts at ``floor`` requests in flight (:data:`SLOW`, or
``FLOWHOOK_WEBHOOK_ENDPOINT_CONCURRENCY`` when that is lower). Each 2xx answered within
:data:`FAST` gives it one more slot, up to ``ceiling`` (``FLOWHOOK_WEBHOOK_ENDPOINT_CONCURRENCY``,
16 by default); a failure, or an answer slower than that, halves its slots, never below
``floor``. So an endpoint that keeps up gets the requests in flight its rate needs (at 8 a
receiver that answers in 6 ms takes at most ~1,300 webhooks a second from one process),
while a slow, failing or dead one is held to ``floor`` and leaves the dispatcher's other
request slots to the others.

An endpoint that answered fast until it died can have ``ceiling`` requests waiting for their
timeout once; its first failures bring it back to ``floor``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from types import TracebackType

__all__ = ["FAST", "SLOW", "EndpointSlots"]

FAST = 1.0
"""Seconds within which a 2xx counts as keeping up."""
SLOW = 8
"""Requests in flight to an endpoint that is slow or failing (at most)."""


class EndpointSlots:
    """At most :attr:`limit` holders at once; the limit moves with the endpoint's answers
    (:meth:`answered`). ``async with slots:`` holds one."""

    __slots__ = ("_waiters", "busy", "ceiling", "floor", "limit")

    def __init__(self, floor: int, ceiling: int) -> None:
        self.floor = floor
        self.ceiling = max(floor, ceiling)
        self.limit = floor
        """Requests allowed in flight now."""
        self.busy = 0
        """Requests in flight (slots held)."""
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> None:
        if self.busy >= self.limit or self._waiters:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # a slot was kept for it (busy counted) by _wake
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # woken and cancelled at once: give the slot on
                else:
                    with contextlib.suppress(ValueError):  # _wake may have dropped it
                        self._waiters.remove(waiter)
                raise
            return
        self.busy += 1

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release()

    def answered(self, ok: bool, seconds: float) -> None:
        """One request's outcome: a 2xx (``ok``) that took ``seconds``."""
        if ok and seconds < FAST:
            if self.limit < self.ceiling:
                self.limit += 1
                self._wake()
        else:
            self.limit = max(self.floor, self.limit // 2)

    def _release(self) -> None:
        self.busy -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand free slots to the first waiters, in order."""
        while self._waiters and self.busy < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.busy += 1
                waiter.set_result(None)
