"""Requests to the daemons: one trio run per public call, sharing one ClusterClient, and the
lookups every part of `api.Cluster` builds on (where, listings, directory expansion, reads)."""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import trio

from .._sync import blocking
from .._trio import open_nursery
from ..cluster import state as state_store
from ..cluster.state import load_secret
from ..errors import GmountError
from ..protocol import messages as msg
from ..protocol.client import ClusterClient, open_client
from .results import Entry, FileLocations, Holder, Listing
from .view import ClusterView

T = TypeVar("T")

#: Largest piece asked for in one read RPC (the daemon's limit).
READ_PIECE = 4 * 1024 * 1024
READS_IN_FLIGHT = 4
#: `where` requests in flight at once in one call (the daemon serves 64 per connection).
LOOKUPS_IN_FLIGHT = 32


class Requests:
    """Runs a call's requests against the cluster's daemons, and the lookups shared by every part."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def run(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `func(connections, *args)` in one trio run, from any thread."""
        state = state_store.load(self._view.name)
        if state is None:
            raise GmountError(f"cluster {self._view.name!r} is no longer running: start it with `gmount up`")
        self._view.state = state  # a restarted cluster has new ports
        secret = load_secret(state.name)

        async def main() -> T:
            async with open_client(state, name="gmount-api", secret=secret) as client:
                return await func(client, *args)

        try:
            result: T = blocking(trio.run, main)
            return result
        except BaseExceptionGroup as group:  # several concurrent requests failed: the first says why
            raise _first_leaf(group) from None

    async def where(self, client: ClusterClient, asking: str, path: str) -> FileLocations:
        rows = await client.ask(asking, msg.Where(path))
        return FileLocations(path, asking, tuple(Holder.from_wire(r) for r in rows))

    async def listing(self, client: ClusterClient, asking: str, path: str) -> Listing:
        """The asking node merges the listing exactly as its mount does (daemon op `ls`)."""
        try:
            reply = await client.ask(asking, msg.Ls(path))
        except (FileNotFoundError, NotADirectoryError):
            found = await self.where(client, asking, path)
            if found.nearest is None:
                raise FileNotFoundError(errno.ENOENT, f"no node holds {path}") from None
            h = found.nearest
            entry = Entry(posixpath.basename(path), path, _kind(h.mode), h.size, h.mtime_ns, h.node, found.nodes)
            return Listing(path, asking, (entry,), ())
        entries = []
        for e in sorted(reply.entries, key=lambda e: e.name):
            entries.append(Entry(e.name, posixpath.join(path, e.name), _kind(e.attr.mode), e.attr.size,
                                 e.attr.mtime_ns, e.node, e.holders))
        return Listing(path, asking, tuple(entries), reply.unreachable)

    async def expand_holders(self, client: ClusterClient, asking: str,
                              paths: list[str]) -> tuple[list[FileLocations], list[str]]:
        """Files named by `paths` with their holders, directories replaced by the files below them.

        Files come back in the order given (directories: sorted by path), several lookups in flight.
        """
        found: dict[str, FileLocations] = {}
        missing: list[str] = []
        seen: set[str] = set()
        limiter = trio.CapacityLimiter(LOOKUPS_IN_FLIGHT)

        async def visit(path: str, nursery: trio.Nursery) -> None:
            if path in seen:
                return
            seen.add(path)
            async with limiter:
                where = await self.where(client, asking, path)
            found[path] = where
            if where.nearest is None:
                missing.append(path)
            elif where.nearest.is_dir:
                async with limiter:
                    listing = await self.listing(client, asking, path)
                for entry in listing.entries:
                    if entry.kind in ("file", "directory"):
                        nursery.start_soon(visit, entry.path, nursery)

        async with open_nursery() as nursery:
            for path in dict.fromkeys(paths):
                nursery.start_soon(visit, path, nursery)
        files: list[FileLocations] = []
        taken: set[str] = set()
        ordered = sorted(found)
        for path in paths:  # given order; what a directory expanded to, sorted, in its place
            prefix = path.rstrip("/") + "/"
            for p in ordered:
                item = found[p]
                if (p == path or p.startswith(prefix)) and p not in taken and item.nearest is not None \
                        and not item.nearest.is_dir:
                    taken.add(p)
                    files.append(item)
        return files, sorted(missing)

    async def expand(self, client: ClusterClient, asking: str,
                      paths: list[str]) -> tuple[list[tuple[str, int]], list[str]]:
        found, missing = await self.expand_holders(client, asking, paths)
        return [(f.path, f.nearest.size) for f in found if f.nearest is not None], missing

    async def read(self, client: ClusterClient, node: str, path: str, start: int, end: int | None) -> bytes:
        """Bytes [start, end) of `path` from `node`, several 4 MiB reads in flight."""
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad byte range [{start}, {end})")
        opened = await client.ask(node, msg.Open(path, os.O_RDONLY))
        try:
            size = opened.attr.size
            return await read_handle(client, node, opened.handle, start, size if end is None else min(end, size))
        finally:
            await close_quietly(client, node, msg.Close(opened.handle))


async def read_handle(client: ClusterClient, node: str, handle: int, start: int, stop: int) -> bytes:
    """Bytes [start, stop) through a handle open on `node`, READS_IN_FLIGHT 4 MiB reads at a time."""
    offsets = list(range(start, stop, READ_PIECE))
    pieces: dict[int, bytes] = {}
    limiter = trio.CapacityLimiter(READS_IN_FLIGHT)

    async def piece(offset: int) -> None:
        async with limiter:
            pieces[offset] = await client.ask(node, msg.Read(handle, offset, min(READ_PIECE, stop - offset)),
                                             timeout=60.0)

    async with open_nursery() as nursery:
        for offset in offsets:
            nursery.start_soon(piece, offset)
    return b"".join(pieces[o] for o in offsets)


async def write_handle(client: ClusterClient, node: str, handle: int, offset: int, pieces: Iterable[bytes],
                       digest: Any) -> int:
    """Send `pieces` to a handle open on `node` from `offset` on, READS_IN_FLIGHT writes at a time.

    Each piece is added to `digest` (a hashlib object) in order; returns the bytes sent.
    """
    in_flight = trio.Semaphore(READS_IN_FLIGHT)
    sent = 0

    async def send(at: int, piece: bytes) -> None:
        try:
            await client.ask(node, msg.Write(handle, at, piece), timeout=60.0)
        finally:
            in_flight.release()

    async with open_nursery() as nursery:
        for piece in pieces:
            for start in range(0, len(piece), READ_PIECE):  # the daemon takes at most 4 MiB a write
                part = piece[start:start + READ_PIECE]
                digest.update(part)
                await in_flight.acquire()
                nursery.start_soon(send, offset + sent, part)
                sent += len(part)
    return sent


async def close_quietly(client: ClusterClient, node: str, request: msg.Close | msg.PutAbort) -> None:
    """Release a handle, even while being cancelled; a handle whose connection is gone died with it."""
    with trio.CancelScope(shield=True):
        try:
            await client.ask(node, request)
        except OSError:
            pass


def readable_holder(found: FileLocations) -> Holder:
    holder = found.nearest
    if holder is None:
        raise FileNotFoundError(errno.ENOENT, f"no node holds {found.path}")
    if holder.is_dir:
        raise IsADirectoryError(errno.EISDIR, f"{found.path} is a directory (on node {holder.node})")
    return holder


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"
