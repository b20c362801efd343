"""Giga+ splitting: a large directory's index in partitions served by several nodes.

A partition of a directory that holds more than `split_entries` names splits in two:
the names (with their claims and leases) that hash to the new partition go to its
server (`Homes.of_partition`). Each node keeps a bitmap of the partitions it knows of;
a request for a name the node does not serve is answered with its bitmap, and the asker
asks again where the merged bitmap says (a hop per stale level). Changes that reach the
home (export scans, forgets) are passed on to every partition's server.
"""

from __future__ import annotations

import errno
import functools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import trio

from ..._trio import open_nursery
from ...protocol import messages as msg
from ...protocol.messages import MAX_PARTITIONS
from ..leases import WHOLE
from .entries import BuiltDirectory, Change, Entries, Holder, Parts, apply_change
from .homes import name_hash, partition_depth, partition_of
from .paths import join, under_any
from .store import IndexStore

log = logging.getLogger(__name__)

#: Operations on one name of a directory: served by the partition the name hashes to.
NAME_OPS = (
    msg.IndexLookup, msg.IndexClaim, msg.IndexSet, msg.IndexDrop, msg.IndexReplace, msg.IndexRename)


class Misdirected(OSError):
    """A request for a name this node does not serve (its directory is split): the asker learns
    `bitmap` and asks the right node. Over the wire (a plain request) it is ESTALE."""

    def __init__(self, directory: str, name: str, me: str, bitmap: set[int]) -> None:
        super().__init__(errno.ESTALE, f"{join(directory, name)} is in a partition of the split directory "
                                       f"{directory} that node {me} does not serve; ask its server")
        self.bitmap = sorted(bitmap)


class Partitioned(IndexStore):
    """The home's index, with its large directories split in partitions (see the module)."""

    def _server_of(self, directory: str, parts: Parts, partition: int) -> str:
        if partition == 0 or self.homes is None:
            return parts.home
        return self.homes.of_partition(directory, partition)

    def _served_here(self, directory: str, parts: Parts) -> list[int]:
        return [p for p in sorted(parts.bitmap) if self._server_of(directory, parts, p) == self._peers.me]

    def _mine(self, directory: str, name: str) -> bool:
        """Whether this node serves `name` of `directory` (always, for a directory that is not split)."""
        parts = self._parts.get(directory)
        if parts is None:
            return True
        return self._server_of(directory, parts, partition_of(name_hash(name), parts.bitmap)) == self._peers.me

    def _bitmap(self, directory: str) -> list[int] | None:
        parts = self._parts.get(directory)
        return None if parts is None else sorted(parts.bitmap)

    def _gated(self, serve: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        """`serve` (a handler of a request on one directory), waiting while a partition of the
        directory splits here; a name this node does not serve (any more) is refused with the
        partitions it knows of (Misdirected). It keeps `serve`'s signature (msg.operations
        reads the request type from it)."""
        @functools.wraps(serve)
        async def gated(request: Any) -> Any:
            directory = request.directory
            self._tidy()
            while (closed := self._closed.get(directory)) is not None:
                await closed.wait()
            self._active[directory] += 1
            try:
                if isinstance(request, NAME_OPS) and not self._mine(directory, request.name):
                    self._redirects += 1
                    raise Misdirected(directory, request.name, self._peers.me, self._parts[directory].bitmap)
                result = await serve(request)
            finally:
                self._active[directory] -= 1
                if self._active[directory] <= 0:
                    del self._active[directory]
                    drained = self._drained.pop(directory, None)
                    if drained is not None:
                        drained.set()
            await self._maybe_split(directory)
            return result

        return gated

    async def op_parts(self, request: msg.IndexParts) -> None:
        """A server of a partition of `directory` split it: the home learns the new partition (so
        its redirects send askers straight there, and it passes changes on to it)."""
        await self._learn(request.directory, request.home, request.bitmap)

    async def _learn(self, directory: str, home: str, bitmap: Collection[int]) -> None:
        """Merge partitions others know of. Bitmaps only grow (until `forget_all`), and the
        partitions this node serves change only when it learns one of its own that it has not
        served yet (its transfer was lost, or the directory split again after a restart):
        the directory is then listed again from the exports, and "not found" handed out for
        names now served elsewhere are revoked."""
        known = {int(partition) for partition in bitmap if 0 <= int(partition) < MAX_PARTITIONS}
        parts = self._parts.get(directory)
        if parts is None:
            if len(known) <= 1:
                return
            served_before = None
            parts = Parts(home, {0})
        else:
            served_before = self._served_here(directory, parts)
        if known <= parts.bitmap:
            return
        parts.bitmap |= known
        self._parts[directory] = parts
        if served_before == self._served_here(directory, parts):
            return
        if served_before is None and directory not in self._dirs and directory not in self._building:
            return  # nothing built here: the first request builds the partitions served here
        self._dirs.pop(directory, None)
        if directory in self._building:
            self._outdated.add(directory)
        for name in [name for name in self._negatives.names(directory) if not self._mine(directory, name)]:
            await self._revoke(directory, name, False, but=None)
        leases = self._listing_leases.revoke(directory, WHOLE)
        if leases:
            await self._tell(leases, msg.IndexUnlist(directory), but=None)

    async def _maybe_split(self, directory: str) -> None:
        """Split each partition served here that holds more than `split_entries` names: partition
        i at depth r becomes i and i + 2**r at depth r + 1, and the names (with their claims,
        "not found" leases, listing leases and subdirectory homes) that hash to the new one go
        to its server. Requests for the directory wait meanwhile (one round trip)."""
        if self.split_entries <= 0 or directory in self._backing or directory in self._closed:
            return
        built = self._dirs.get(directory)
        if built is None or len(built.entries) <= self._split_check.get(directory, self.split_entries):
            return
        closed = self._closed[directory] = trio.Event()
        try:
            if self._active.get(directory):
                drained = self._drained[directory] = trio.Event()
                await drained.wait()
            while (built := self._dirs.get(directory)) is not None and directory not in self._backing:
                parts = self._parts.get(directory) or Parts(self._peers.me, {0})
                counts = Counter(partition_of(name_hash(name), parts.bitmap) for name in built.entries)
                partition, count = max(counts.items(), key=lambda item: (item[1], -item[0]), default=(0, 0))
                new = partition + (1 << partition_depth(partition, parts.bitmap))
                if count <= self.split_entries or new >= MAX_PARTITIONS:
                    # no partition here can pass the threshold before this many more names
                    self._split_check[directory] = len(built.entries) + max(0, self.split_entries - count)
                    break
                await self._split(directory, built, parts, new)
        finally:
            del self._closed[directory]
            closed.set()

    async def _split(self, directory: str, built: BuiltDirectory, parts: Parts, new: int) -> None:
        self._splits += 1
        parts.bitmap.add(new)
        self._parts[directory] = parts
        target = self._server_of(directory, parts, new)
        log.info("node %s splits the index of %s: partition %d goes to %s", self._peers.me, directory, new, target)
        if target == self._peers.me:
            return  # served here too: nothing moves
        now = trio.current_time()
        moved = {name: holders for name, holders in built.entries.items()
                 if partition_of(name_hash(name), parts.bitmap) == new}
        for name in moved:
            del built.entries[name]
        leased = {name: self._negatives.revoke(directory, name) for name in self._negatives.names(directory)
                  if not self._mine(directory, name)}
        records = self._child_homes.get(directory, {})
        home_leases = {name: self._home_leases.holders(directory, name) for name in moved}
        listing_leases = self._listing_leases.holders(directory, WHOLE)
        payload = msg.SplitPayload(
            home=parts.home, bitmap=sorted(parts.bitmap), partition=new,
            entries=[msg.SplitEntry(name, node, holder.is_dir, holder.attr, holder.replica_of,
                                    None if holder.since is None else now - holder.since)
                     for name, holders in moved.items() for node, holder in holders.items()],
            missing=list(built.missing), exists=built.exists, holders=sorted(built.holders),
            negatives={name: {node: until - now for node, until in askers.items() if until > now}
                       for name, askers in leased.items()},
            listing_leases={node: until - now for node, until in listing_leases.items() if until > now},
            child_homes={name: records[name] for name in moved if name in records},
            home_leases={name: {node: until - now for node, until in home_leases[name].items() if until > now}
                         for name in moved if home_leases[name]},
        )
        try:
            await self._peers.ask(target, msg.IndexSplit(directory, payload), timeout=self.ask_timeout)
        except OSError as exc:
            # the new server lists the partition from the exports when first asked; what only this
            # node knew goes: whoever was told "not found" for those names is told to ask again
            log.info("could not hand partition %d of %s to %s: %s", new, directory, target, exc)
            for name, askers in leased.items():
                await self._tell({node: float("inf") for node in askers}, msg.Created(join(directory, name), False),
                                 but=None)
        if parts.home != self._peers.me:
            try:
                await self._peers.ask(parts.home, msg.IndexParts(directory, parts.home, sorted(parts.bitmap)),
                                      timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not tell %s, the home of %s, of its partition %d: %s", parts.home, directory, new, exc)

    async def op_split(self, request: msg.IndexSplit) -> None:
        """Become the server of a partition another node split off (`_split`): its names, claims
        and leases. A partition this node serves already (it learnt of it from an asker and
        listed it from the exports) keeps its own names; the leases are merged in."""
        directory, payload = request.directory, request.payload
        now = trio.current_time()
        parts = self._parts.get(directory)
        fresh = parts is None or payload.partition not in parts.bitmap
        served_before = [] if parts is None else self._served_here(directory, parts)
        if parts is None:
            parts = self._parts[directory] = Parts(payload.home, {0})
        parts.bitmap |= set(payload.bitmap)
        if fresh:
            changes: list[Change] = [
                (entry.name, entry.node, Holder(entry.is_dir, entry.attr, entry.replica_of,
                                                None if entry.age is None else now - entry.age))
                for entry in payload.entries]
            if directory in self._dirs or directory in self._building:
                for change in changes:
                    self._change(directory, change)
            elif not served_before:  # nothing else of it here: the partition is the whole index
                entries: Entries = {}
                for change in changes:
                    apply_change(entries, change)
                self._dirs[directory] = BuiltDirectory(entries, now, tuple(payload.missing), payload.exists,
                                                       set(payload.holders))
            # else: other partitions here are not built: the next request lists them all
        for name, askers in payload.negatives.items():
            for node, left in askers.items():
                self._negatives.grant(directory, name, node, now + left)
        listing = self._listing_leases.holders(directory, WHOLE)
        for node, left in payload.listing_leases.items():
            self._listing_leases.grant(directory, WHOLE, node, max(listing.get(node, 0.0), now + left))
        if payload.child_homes:
            self._child_homes.setdefault(directory, {}).update(payload.child_homes)
        for name, askers in payload.home_leases.items():
            for node, left in askers.items():
                self._home_leases.grant(directory, name, node, now + left)

    async def _pass_on(self, directory: str, parts: Parts, change: msg.IndexSync | msg.IndexForget,
                       covered: list[int] | None) -> None:
        """Send `change` (its `covered`: this node's bitmap) to the servers of the partitions this
        node knows of and the sender did not (`covered`, the sender's bitmap): from the home to
        every partition it knows, and from the server of a partition to the ones it split off and
        has not told the home of yet."""
        skip = set(covered or ())
        targets: dict[str, int] = {}
        for partition in sorted(parts.bitmap - skip):
            server = self._server_of(directory, parts, partition)
            if server != self._peers.me:
                targets.setdefault(server, partition)
        bitmap = sorted(parts.bitmap)

        async def send(server: str, partition: int) -> None:
            try:
                if isinstance(change, msg.IndexSync):
                    await self._peers.ask(server, msg.IndexPart(partition, parts.home, bitmap, change),
                                          timeout=self.ask_timeout)
                else:
                    await self._peers.ask(server, change, timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not pass %s of %s on to %s: %s", change.op, directory, server, exc)

        async with open_nursery() as nursery:
            for server, partition in targets.items():
                nursery.start_soon(send, server, partition)

    async def op_forget(self, request: msg.IndexForget) -> None:
        """Directories under `prefixes` changed wholesale (renamed, removed, or a change failed
        half-way): build their indexes again from the exports when next asked. The servers of
        the partitions of split directories among them do the same."""
        self.forget(request.prefixes)
        under = under_any(request.prefixes)
        for directory, parts in list(self._parts.items()):
            if under(directory):
                await self._pass_on(directory, parts, msg.IndexForget([directory], sorted(parts.bitmap)),
                                    request.covered)
