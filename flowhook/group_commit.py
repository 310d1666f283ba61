"""Group commit: concurrent requests share one write transaction.

Requests that arrive while a transaction is being committed wait for the next one, which
takes them all. An idle service commits a lone request at once (no added delay), and a busy
one turns hundreds of single-row transactions into a few large ones. Each caller still gets
its answer only after its rows are committed.

One caller's bad item must not fail the others it shared a transaction with: when a batch's
commit raises and ``isolate`` says the error may be one item's fault, each item is committed
again on its own, so only the item that fails again gets the error. Off by default: redoing
items is right only where a commit that failed is known to have written nothing and an item
may be applied alone (accepting runs; the engine's progress writes, see
``worker.redo_alone``), not where an unknown outcome could apply work twice (a connection
lost during COMMIT).

``gather`` trades a little latency for fewer transactions: each transaction takes what
arrived over at least that long, so more requests join it (the webhook dispatcher's
completions). The committer waits only for what the last transaction did not already take:
behind a commit as long as ``gather`` the next batch has gathered, and waiting again left
the writer idle while requests queued (a third of each cycle of PostgreSQL's completions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupCommit"]

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    def __init__(
        self,
        commit: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
        *,
        max_batch: int = 256,
        isolate: Callable[[BaseException], bool] = lambda exc: False,
        gather: float = 0.0,
    ) -> None:
        self._commit = commit
        self._max = max_batch
        self._isolate = isolate
        self._gather = gather
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await future

    async def wait_idle(self) -> None:
        """Wait until what was submitted so far is committed (or has failed)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait([self._task])

    async def cancel(self) -> None:
        """Stop committing: cancel the transaction under way (its callers get
        ``CancelledError``) and drop what waits for the next one (its callers' futures are
        cancelled). A later ``submit`` starts afresh."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        dropped, self._pending = self._pending, []
        for _, future in dropped:
            future.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        taken = loop.time()  # the writer was idle: what it takes next starts arriving now
        while self._pending:
            if self._gather:  # only what the last transaction did not already wait out
                wait = self._gather - (loop.time() - taken)
                if wait > 0:
                    await asyncio.sleep(wait)
            taken = loop.time()
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            try:
                results = await self._commit([item for item, _ in batch])
            except BaseException as exc:
                if len(batch) > 1 and self._isolate(exc):
                    await self._one_by_one(batch)
                    continue
                self._settle(batch, [exc] * len(batch))
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            self._settle(batch, results)

    async def _one_by_one(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        for entry in batch:
            try:
                results = await self._commit([entry[0]])
            except BaseException as exc:
                self._settle([entry], [exc])
                if isinstance(exc, asyncio.CancelledError):
                    self._settle(batch, [exc] * len(batch))
                    raise
                continue
            self._settle([entry], results)

    @staticmethod
    def _settle(
        batch: Sequence[tuple[T, asyncio.Future[R]]], results: Sequence[R | BaseException]
    ) -> None:
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
