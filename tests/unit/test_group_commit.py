"""Group commit: one item that makes its batch's commit fail fails alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

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
