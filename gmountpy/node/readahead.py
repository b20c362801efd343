"""Read-ahead for sequential reads of a remote file.

The kernel asks for 128 KiB at a time; one RPC per request leaves the link
idle for a round trip each time. Once a handle reads sequentially, this
fetches aligned 1 MiB blocks and keeps the next few in flight, so the
holder streams while the kernel consumes. Random reads are passed through
at exactly the offset and size asked for (Montage's mConcatFit reads small
pieces of many files: fetching whole blocks there would waste bandwidth).

The holder sends each byte of a sequential read once: the first block is
fetched from where the reader has got to (not again from the block's
start), the last, short block is kept like the others, and nothing is read
ahead past the end of the file as known (its size at open, or the end a
reply showed). A file that grows is still read to its new end: a read past
the known end asks the holder for what follows it.

Blocks belong to one open handle and die with it (close-to-open); they are
dropped when the file is written through any handle of this node. All
handles of a node draw their blocks from one MemoryBudget
(tuning.readahead_mib): when it is spent, reads go straight to the holder,
exactly as asked, until blocks are freed -- slower, never an error.
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import NamedTuple

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
    def __init__(self, base: int) -> None:
        self.base = base  # the first byte asked for: the block's start, or where the reader had got to
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None


class _Block(NamedTuple):
    """Bytes [base, base + len(data)) of one aligned block; shorter than the block at the file's end."""

    base: int
    data: bytes

    @property
    def stop(self) -> int:
        return self.base + len(self.data)


class ReadAhead:
    """The read-ahead of one open handle of a remote file whose size at open was `size` (None: unknown)."""

    def __init__(self, fetch: Fetch, nursery: trio.Nursery, budget: MemoryBudget | None = None,
                 size: int | None = None) -> None:
        self._fetch = fetch
        self._nursery = nursery
        self._budget = budget if budget is not None else NODE_BUDGET
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._pending: dict[int, _Pending] = {}
        self._next_offset = -1
        self._streak = 0
        self._end = size  # the file's end as last known: nothing is read ahead from there on
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
        end = offset + size
        parts: list[bytes] = []
        position = offset
        while position < end:
            found = await self._bytes_at(position)
            if found is None:  # no budget for a block: the rest of this read goes to the holder as it is
                parts.append(await self._fetch(position, end - position))
                break
            block, fresh = found
            piece = block.data[position - block.base:min(end, block.stop) - block.base]
            parts.append(piece)
            position += len(piece)
            if not piece or (fresh and block.stop < _block_end(block.base)):
                break  # the end of the file, as the holder has just said
        self._prefetch((end - 1) // BLOCK + 1)
        return b"".join(parts)

    def invalidate(self) -> None:
        """The file was written through this node: cached blocks, and the end known, may be stale."""
        self._budget.give(BLOCK * len(self._blocks))  # pending blocks give theirs back when they finish
        self._blocks.clear()
        self._pending.clear()
        self._generation += 1
        self._end = None

    def close(self) -> None:
        """The handle is closing: stop fetching for it."""
        for scope in self._scopes:
            scope.cancel()
        self.invalidate()

    def _covered(self, offset: int, size: int) -> bool:
        position, end = offset, offset + size
        while position < end:
            block = self._blocks.get(position // BLOCK)
            if block is None or not block.base <= position < block.stop:
                return False
            position = block.stop
        return True

    async def _bytes_at(self, position: int) -> tuple[_Block, bool] | None:
        """The block holding `position` (its bytes from `position` on, at least), and whether it was
        fetched for this read; None without budget for a block."""
        index = position // BLOCK
        cached = self._blocks.get(index)
        if cached is not None and cached.base <= position < cached.stop:
            self._blocks.move_to_end(index)
            return cached, False
        # Not kept, or past the end of a short block (the end of the file when it was fetched): ask the
        # holder, from `position` on (a file read past its end may have grown).
        pending = self._pending.get(index)
        if pending is None or pending.base > position:
            pending = self._start(index, position)
            if pending is None:
                return None
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.data is not None
        merged = self._blocks.get(index)  # the tail just fetched, joined to what was kept before it
        if merged is not None and merged.base <= position < merged.stop:
            return merged, True
        return _Block(pending.base, pending.data), True

    def _prefetch(self, start: int) -> None:
        for index in range(start, start + AHEAD):
            if self._end is not None and index * BLOCK >= self._end:
                break  # do not read ahead past the end
            if index in self._blocks or index in self._pending:
                continue
            if self._start(index, index * BLOCK) is None:
                break

    def _start(self, index: int, base: int) -> _Pending | None:
        """Fetch bytes [base, end of block `index`) in the background; None without budget."""
        if not self._budget.take(BLOCK):
            return None
        pending = self._pending[index] = _Pending(base)
        self._nursery.start_soon(self._run, index, pending, self._generation)
        return pending

    async def _run(self, index: int, pending: _Pending, generation: int) -> None:
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                pending.data = await self._fetch(pending.base, _block_end(pending.base) - pending.base)
            if scope.cancelled_caught:
                pending.error = OSError(errno.EBADF, "file closed while reading ahead")
        except Exception as exc:  # delivered to whoever waits for this block
            pending.error = exc
        finally:
            self._scopes.discard(scope)
            if self._pending.get(index) is pending:
                del self._pending[index]
            if pending.data is not None and generation == self._generation:
                self._keep(index, _Block(pending.base, pending.data))
            else:
                self._budget.give(BLOCK)
            pending.done.set()

    def _keep(self, index: int, block: _Block) -> None:
        """Keep a fetched block (it holds one BLOCK of budget) and learn the file's end from it."""
        if block.stop < _block_end(block.base):
            self._end = block.stop  # the holder had no more: the end, for now
        elif self._end is not None and block.stop > self._end:
            self._end = None  # the file grew past its known end: read ahead until a reply shows the new one
        old = self._blocks.get(index)
        if old is not None:
            self._budget.give(BLOCK)  # replaces (or extends) a block that holds budget already
            if old.base < block.base <= old.stop:  # a tail fetched after a short block: join them
                block = _Block(old.base, old.data[:block.base - old.base] + block.data)
        self._blocks[index] = block
        self._blocks.move_to_end(index)
        while len(self._blocks) > KEEP:
            self._blocks.popitem(last=False)
            self._budget.give(BLOCK)


def _block_end(offset: int) -> int:
    """The end of the aligned block holding `offset`."""
    return (offset // BLOCK + 1) * BLOCK
