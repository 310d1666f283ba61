"""Group commit: one item that makes its batch's commit fail fails alone; the worker's
choice of which failed batches to redo item by item."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from flowhook.engine.worker import redo_alone
from flowhook.errors import StoreUnavailable, WriteConflict
from flowhook.group_commit import GroupCommit


class Bad(Exception):
    pass


class Ledger:
    """A commit that writes all of a batch or nothing, and refuses negative numbers."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.batches: list[list[int]] = []

    async def commit(self, batch: Sequence[int]) -> list[int | BaseException]:
        self.batches.append(list(batch))
        await asyncio.sleep(0)  # let the other callers queue behind this commit
        if any(n < 0 for n in batch):
            raise Bad(f"negative number in {list(batch)}")
        self.rows.extend(batch)
        return [n * 10 for n in batch]


async def test_one_failing_item_fails_only_its_caller() -> None:
    ledger = Ledger()
    group: GroupCommit[int, int] = GroupCommit(
        ledger.commit, isolate=lambda exc: isinstance(exc, Bad)
    )
    first = asyncio.ensure_future(group.submit(0))  # commits alone; the rest queue behind it
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(group.submit(n)) for n in (1, 2, -3, 4, 5)]
    results = await asyncio.gather(first, *rest, return_exceptions=True)
    assert results[:3] == [0, 10, 20]
    assert isinstance(results[3], Bad)
    assert results[4:] == [40, 50]
    assert sorted(ledger.rows) == [0, 1, 2, 4, 5]
    assert [1, 2, -3, 4, 5] in ledger.batches  # they did share a commit before it failed


async def test_without_isolation_a_failure_fails_the_whole_batch() -> None:
    ledger = Ledger()
    group: GroupCommit[int, int] = GroupCommit(ledger.commit)  # no isolation by default
    first = asyncio.ensure_future(group.submit(0))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(group.submit(n)) for n in (1, -2, 3)]
    await first
    for future in rest:
        with pytest.raises(Bad):
            await future
    assert ledger.rows == [0]


class Flaky:
    """A commit that fails every batch of more than one item with ``error`` (as a batch
    that lost its lock conflicts over and over), and any batch holding a negative number."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.rows: list[int] = []
        self.batches: list[list[int]] = []

    async def commit(self, batch: Sequence[int]) -> list[int | BaseException]:
        self.batches.append(list(batch))
        await asyncio.sleep(0)
        if len(batch) > 1:
            raise self.error
        if batch[0] < 0:
            raise Bad("negative")
        self.rows.extend(batch)
        return [n * 10 for n in batch]


async def _submit_batch(group: GroupCommit[int, int], items: list[int]) -> list[object]:
    first = asyncio.ensure_future(group.submit(0))  # commits alone; the rest share a batch
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(group.submit(n)) for n in items]
    return list(await asyncio.gather(first, *rest, return_exceptions=True))


def test_a_worker_redoes_a_batch_run_by_run_unless_the_connection_was_lost() -> None:
    assert redo_alone(WriteConflict("lost a lock conflict (40P01)"))
    assert redo_alone(RuntimeError("one run's bad value"))
    assert not redo_alone(StoreUnavailable("the database cannot be reached"))
    assert not redo_alone(asyncio.CancelledError())


async def test_a_batch_that_keeps_losing_conflicts_is_redone_item_by_item() -> None:
    """No item is dropped with its batch: each is committed on its own, and only the item
    that fails alone gets an error."""
    flaky = Flaky(WriteConflict("the transaction lost a lock conflict (40P01)"))
    group: GroupCommit[int, int] = GroupCommit(flaky.commit, isolate=redo_alone)
    results = await _submit_batch(group, [1, 2, -3, 4])
    assert results[:3] == [0, 10, 20]
    assert isinstance(results[3], Bad)
    assert results[4] == 40
    assert sorted(flaky.rows) == [0, 1, 2, 4]
    assert [1, 2, -3, 4] in flaky.batches


async def test_a_batch_whose_connection_was_lost_is_not_redone() -> None:
    """Its COMMIT may have landed: redoing the items could apply them twice."""
    flaky = Flaky(StoreUnavailable("the database cannot be reached"))
    group: GroupCommit[int, int] = GroupCommit(flaky.commit, isolate=redo_alone)
    results = await _submit_batch(group, [1, 2])
    assert results[0] == 0
    assert all(isinstance(r, StoreUnavailable) for r in results[1:])
    assert flaky.batches == [[0], [1, 2]]


async def test_gathering_lets_items_that_come_meanwhile_join_the_transaction() -> None:
    ledger = Ledger()
    group: GroupCommit[int, int] = GroupCommit(ledger.commit, gather=0.01)
    first = asyncio.ensure_future(group.submit(1))
    await asyncio.sleep(0)  # the committer is gathering, not yet committing
    rest = [asyncio.ensure_future(group.submit(n)) for n in (2, 3)]
    assert await asyncio.gather(first, *rest) == [10, 20, 30]
    assert ledger.batches == [[1, 2, 3]]


async def test_a_batch_that_gathered_during_a_long_commit_is_committed_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_sleep = asyncio.sleep
    gathered: list[float] = []

    async def sleep(delay: float) -> None:  # the committer's waits
        gathered.append(delay)
        await real_sleep(delay)

    batches: list[list[int]] = []
    arrived = asyncio.Event()

    async def slow_commit(batch: Sequence[int]) -> list[int]:
        batches.append(list(batch))
        if len(batches) == 1:
            await arrived.wait()  # the next items come while this commits, past the gather
            await real_sleep(0.03)
        return [n * 10 for n in batch]

    monkeypatch.setattr("flowhook.group_commit.asyncio.sleep", sleep)
    group: GroupCommit[int, int] = GroupCommit(slow_commit, gather=0.01)
    first = asyncio.ensure_future(group.submit(1))
    await real_sleep(0.02)  # gathered, now committing
    rest = [asyncio.ensure_future(group.submit(n)) for n in (2, 3)]
    arrived.set()
    assert await asyncio.gather(first, *rest) == [10, 20, 30]
    assert batches == [[1], [2, 3]]
    assert gathered == [pytest.approx(0.01, abs=0.005)]  # before the first transaction only


async def test_without_gathering_a_lone_item_commits_at_once() -> None:
    ledger = Ledger()
    group: GroupCommit[int, int] = GroupCommit(ledger.commit)
    first = asyncio.ensure_future(group.submit(1))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(group.submit(n)) for n in (2, 3)]
    await asyncio.gather(first, *rest)
    assert ledger.batches == [[1], [2, 3]]


class Hanging:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    async def commit(self, batch: Sequence[int]) -> list[int | BaseException]:
        self.batches.append(list(batch))
        await asyncio.Event().wait()  # a transaction that never ends
        raise AssertionError("unreachable")


async def test_cancel_ends_the_transaction_under_way_and_drops_the_rest() -> None:
    hanging = Hanging()
    group: GroupCommit[int, int] = GroupCommit(hanging.commit)
    first = asyncio.ensure_future(group.submit(1))
    await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(group.submit(2))
    await asyncio.sleep(0)
    await group.cancel()
    results = await asyncio.gather(first, queued, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert hanging.batches == [[1]]  # the queued item never reached a transaction
    await group.wait_idle()  # nothing left running


async def test_after_cancel_a_new_submit_commits() -> None:
    ledger = Ledger()
    group: GroupCommit[int, int] = GroupCommit(ledger.commit)
    await group.cancel()  # nothing under way: a no-op
    assert await group.submit(4) == 40
