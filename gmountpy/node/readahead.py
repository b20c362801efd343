"""Read-ahead for sequential reads of a remote file.

The kernel asks for 128 KiB at a time; one RPC per request leaves the link
idle for a round trip each time. Once a handle reads sequentially, this
fetches aligned 1 MiB blocks and keeps the next few in flight, so the
holder streams while the kernel consumes. Random reads are passed through
at exactly the offset and size asked for (Montage's mConcatFit reads small
pieces of many files: fetching whole blocks there would waste bandwidth).

Blocks belong to one open handle and die with it (close-to-open); they are
dropped when the file is written through any handle of this node. The last,
short block of the file is never kept: a file that grows after a read hit
its end is read to its new end. All handles of a node draw their blocks from
one MemoryBudget (tuning.readahead_mib): when it is spent, reads go straight
to the holder, exactly as asked, until blocks are freed -- slower, never an error.
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import trio

BLOCK = 1 << 20
AHEAD = 4             # blocks kept in flight ahead of the reader
KEEP = AHEAD + 4      # blocks kept in memory per handle
SEQUENTIAL_AFTER = 2  # consecutive sequential reads before switching to blocks

Fetch = Callable[[int, int], Awaitable[bytes]]

log = logging.getLogger(__name__)


class MemoryBudget:
    """Bytes of read-ahead a node may hold over all its open handles."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.refused = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            if not self.refused and self.limit:  # a limit of 0 switches read-ahead off: nothing to warn about
                log.warning("read-ahead memory limit reached (%d MiB, tuning.readahead_mib): further "
                            "sequential reads go straight to the holder until blocks are freed", self.limit >> 20)
            self.refused += 1
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


#: The budget of this process's node (one mount per process); the daemon sets its limit from tuning.
NODE_BUDGET = MemoryBudget(256 << 20)


class _Pending:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None


class ReadAhead:
    def __init__(self, fetch: Fetch, nursery: trio.Nursery, budget: MemoryBudget | None = None) -> None:
        self._fetch = fetch
        self._nursery = nursery
        self._budget = budget if budget is not None else NODE_BUDGET
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._pending: dict[int, _Pending] = {}
        self._next_offset = -1
        self._streak = 0
        self._eof_block: int | None = None
        self._generation = 0
        self._scopes: set[trio.CancelScope] = set()

    async def read(self, offset: int, size: int) -> bytes:
        sequential = offset == self._next_offset
        self._streak = self._streak + 1 if sequential else 0
        self._next_offset = offset + size
        if size <= 0:
            return b""
        if self._streak < SEQUENTIAL_AFTER and not self._covered(offset, size):
            return await self._fetch(offset, size)
        first, last = offset // BLOCK, (offset + size - 1) // BLOCK
        parts = []
        for index in range(first, last + 1):
            data = await self._block(index)
            if data is None:  # no budget for a block: this read goes to the holder as it is
                return await self._fetch(offset, size)
            parts.append(data)
            if len(data) < BLOCK:
                self._eof_block = index
                break
        self._prefetch(last + 1)
        start = offset - first * BLOCK
        return b"".join(parts)[start:start + size]

    def invalidate(self) -> None:
        """The file was written through this node: cached blocks may be stale."""
        self._budget.give(BLOCK * len(self._blocks))  # pending blocks give theirs back when they finish
        self._blocks.clear()
        self._pending.clear()
        self._generation += 1
        self._eof_block = None

    def close(self) -> None:
        """The handle is closing: stop fetching for it."""
        for scope in self._scopes:
            scope.cancel()
        self.invalidate()

    def _covered(self, offset: int, size: int) -> bool:
        first, last = offset // BLOCK, (offset + size - 1) // BLOCK
        return all(i in self._blocks for i in range(first, last + 1))

    async def _block(self, index: int) -> bytes | None:
        cached = self._blocks.get(index)
        if cached is not None:
            self._blocks.move_to_end(index)
            return cached
        pending = self._pending.get(index)
        if pending is None:
            # Asked for explicitly: fetch even past the end seen so far (the file may have grown).
            pending = self._start(index, explicit=True)
            if pending is None:
                return None  # no budget for a block
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.data is not None
        return pending.data

    def _prefetch(self, start: int) -> None:
        for index in range(start, start + AHEAD):
            if index in self._blocks or index in self._pending:
                continue
            if self._start(index) is None:
                break

    def _start(self, index: int, explicit: bool = False) -> _Pending | None:
        """Fetch a block in the background; None past the end seen so far (unless asked for) or without budget."""
        if not explicit and self._eof_block is not None and index >= self._eof_block:
            return None  # do not read ahead past the end
        if not self._budget.take(BLOCK):
            return None
        pending = self._pending[index] = _Pending()
        self._nursery.start_soon(self._run, index, pending, self._generation)
        return pending

    async def _run(self, index: int, pending: _Pending, generation: int) -> None:
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                pending.data = await self._fetch(index * BLOCK, BLOCK)
            if scope.cancelled_caught:
                pending.error = OSError(errno.EBADF, "file closed while reading ahead")
        except Exception as exc:  # delivered to whoever waits for this block
            pending.error = exc
        finally:
            self._scopes.discard(scope)
            if self._pending.get(index) is pending:
                del self._pending[index]
            if pending.data is not None and generation == self._generation:
                if len(pending.data) < BLOCK:
                    self._eof_block = index  # the end, for now: delivered, not kept
                    self._budget.give(BLOCK)
                else:
                    if index in self._blocks:
                        self._budget.give(BLOCK)  # replaces a block that holds budget already
                    self._blocks[index] = pending.data
                    if self._eof_block is not None and index >= self._eof_block:
                        self._eof_block = None  # the file grew
                while len(self._blocks) > KEEP:
                    self._blocks.popitem(last=False)
                    self._budget.give(BLOCK)
            else:
                self._budget.give(BLOCK)
            pending.done.set()
