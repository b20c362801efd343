"""Read-ahead of one handle: closing it stops its fetches in flight and gives their memory back."""

from __future__ import annotations

import trio
import trio.testing

from gmountpy._trio import open_nursery
from gmountpy.node.readahead import AHEAD, BLOCK, MemoryBudget, ReadAhead

from .._trio import trio_test


@trio_test
async def test_closing_cancels_the_fetches_in_flight_and_frees_their_memory() -> None:
    started: list[int] = []
    cancelled: list[int] = []
    may_finish = trio.Event()

    async def fetch(offset: int, size: int) -> bytes:
        started.append(offset)
        if offset >= 2 * BLOCK:  # blocks read ahead: still on their way when the file closes
            try:
                await may_finish.wait()
            except trio.Cancelled:
                cancelled.append(offset)
                raise
        return b"x" * size

    budget = MemoryBudget(64 * BLOCK)
    async with open_nursery() as nursery:
        reader = ReadAhead(fetch, nursery, budget)
        for offset in range(0, 2 * BLOCK, 128 << 10):  # sequential: read-ahead starts
            assert await reader.read(offset, 128 << 10) == b"x" * (128 << 10)
        await trio.testing.wait_all_tasks_blocked()
        in_flight = [o for o in started if o >= 2 * BLOCK]
        assert len(in_flight) == AHEAD and budget.used > 0
        reader.close()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(cancelled) == sorted(in_flight)
        assert budget.used == 0
