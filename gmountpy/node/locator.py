"""Where is a path? GMount's locality-aware lookup, behind a narrow seam.

The `Locator` protocol is all the rest of the node knows about finding
files: find the nearest holder, find all holders, and be told of local
creates, removals and renames. `FloodLocator` implements GMount's search:
ask this node, then the nodes of its site in parallel, then each other site
nearest first; the first tier with a positive reply wins, and the reply
carries the attributes (location piggybacking). A later locator can replace
the flooding with per-directory indexes without touching the FUSE layer.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import trio

from ..errors import PeerUnavailable
from .export import Attr
from .peers import PeerPool
from .._trio import open_nursery

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Location:
    """A node that holds a path, with the path's attributes on that node."""

    node: str
    attr: Attr
    replica_of: str | None = None  # set when this copy is a staged replica of that node's file


class Locator(Protocol):
    async def find(self, path: str) -> Location | None: ...
    async def find_all(self, path: str) -> list[Location]: ...
    def learn(self, path: str, location: Location) -> None: ...
    def note_created(self, path: str, location: Location) -> None: ...
    def note_removed(self, path: str) -> None: ...
    def note_renamed(self, src: str, dst: str, is_dir: bool) -> None: ...
    def invalidate(self, path: str) -> None: ...
    def forget_all(self) -> None: ...


@dataclass(frozen=True)
class LocatorStatistics:
    hits: int
    negative_hits: int
    misses: int
    remote_queries: int
    cached: int


class FloodLocator:
    def __init__(
        self,
        peers: PeerPool,
        tiers: list[tuple[str, ...]],
        *,
        ttl: float = 1.0,
        negative_ttl: float = 1.0,
        max_entries: int = 200_000,
    ) -> None:
        self._peers = peers
        self.tiers = tiers
        self.order = [node for tier in tiers for node in tier]
        self._rank = {node: i for i, node in enumerate(self.order)}
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self._max = max_entries
        self._positive: OrderedDict[str, tuple[Location, float]] = OrderedDict()
        self._negative: OrderedDict[str, float] = OrderedDict()
        self._inflight: dict[str, _Flight] = {}
        self._hits = self._negative_hits = self._misses = self._remote = 0

    # -- the search ----------------------------------------------------------

    async def find(self, path: str) -> Location | None:
        now = trio.current_time()
        cached = self._positive.get(path)
        if cached is not None and cached[1] > now:
            self._hits += 1
            return cached[0]
        expires = self._negative.get(path)
        if expires is not None and expires > now:
            self._negative_hits += 1
            return None
        while (flight := self._inflight.get(path)) is not None:  # someone is already searching
            await flight.done.wait()
            if flight.finished:
                return flight.result
            # That search was cancelled (an interrupted caller) or failed: its "no answer" is
            # not a "no such file", so search again rather than report ENOENT.
        self._misses += 1
        flight = self._inflight[path] = _Flight()
        try:
            flight.result = await self._search(path)
            flight.finished = True
        finally:
            del self._inflight[path]
            flight.done.set()
        if flight.result is None:
            self._remember_negative(path)
        else:
            self.learn(path, flight.result)
        return flight.result

    async def _search(self, path: str) -> Location | None:
        for tier in self.tiers:
            replies = await self._ask(tier, path)
            for node in tier:
                reply = replies.get(node)
                if reply is None:
                    continue
                attr, replica = reply
                if replica is None:
                    return Location(node, attr)
                # A staged replica serves reads only on its own node, and only while
                # its source is unchanged; elsewhere the source is the holder.
                if node == self._peers.me and await self._replica_still_valid(path, replica):
                    return Location(node, attr, replica_of=replica[0])
        return None

    async def _replica_still_valid(self, path: str, replica: tuple[str, int, int]) -> bool:
        source, size, mtime_ns = replica
        try:
            value = await self._peers.call(source, "lookup", path)
        except OSError:
            return False  # cannot vouch for it: use the source (or fail) rather than risk stale data
        if value is not None and (Attr.from_wire(value).size, Attr.from_wire(value).mtime_ns) == (size, mtime_ns):
            return True
        log.info("replica of %s from %s is stale; dropping it", path, source)
        try:
            await self._peers.call(self._peers.me, "drop_replica", path, size, mtime_ns)
        except OSError as exc:
            log.warning("could not drop stale replica %s: %s", path, exc)
        return False

    async def find_all(self, path: str) -> list[Location]:
        """Every holder, nearest first, with valid replicas marked (asks all nodes; for `where`)."""
        replies = await self._ask(tuple(self.order), path)
        found = []
        for node in self.order:
            reply = replies.get(node)
            if reply is None:
                continue
            attr, replica = reply
            if replica is None:
                found.append(Location(node, attr))
                continue
            source_reply = replies.get(replica[0])
            if source_reply is not None and source_reply[1] is None and \
                    (source_reply[0].size, source_reply[0].mtime_ns) == (replica[1], replica[2]):
                found.append(Location(node, attr, replica_of=replica[0]))
        if not found:
            self._remember_negative(path)
        return found

    async def _ask(self, nodes: tuple[str, ...], path: str) -> dict[str, tuple[Attr, tuple[str, int, int] | None] | None]:
        """Ask nodes in parallel whether they hold `path`; unreachable nodes count as 'no'."""
        replies: dict[str, tuple[Attr, tuple[str, int, int] | None] | None] = {}

        async def ask(node: str) -> None:
            if node != self._peers.me:
                self._remote += 1
            try:
                value = await self._peers.call(node, "locate", path)
            except PeerUnavailable:
                return
            except OSError as exc:
                log.debug("lookup of %s on %s failed: %s", path, node, exc)
                return
            if value is None:
                replies[node] = None
            else:
                attr, replica = value
                replies[node] = (Attr.from_wire(attr), None if replica is None else (str(replica[0]), int(replica[1]), int(replica[2])))

        if len(nodes) == 1:
            await ask(nodes[0])
        else:
            async with open_nursery() as nursery:
                for node in nodes:
                    if not self._peers.is_down(node):
                        nursery.start_soon(ask, node)
        return replies

    # -- being told --------------------------------------------------------

    def rank(self, node: str) -> int:
        return self._rank.get(node, len(self._rank))

    def learn(self, path: str, location: Location) -> None:
        self._negative.pop(path, None)
        self._positive[path] = (location, trio.current_time() + self.ttl)
        self._positive.move_to_end(path)
        if len(self._positive) > self._max:
            self._positive.popitem(last=False)

    def note_created(self, path: str, location: Location) -> None:
        self.learn(path, location)
        self._positive.pop(_parent(path), None)  # the directory's nlink, mtime and ctime changed

    def note_removed(self, path: str) -> None:
        self._positive.pop(path, None)
        self._positive.pop(_parent(path), None)
        self._remember_negative(path)

    def note_renamed(self, src: str, dst: str, is_dir: bool) -> None:
        """Forget both names; for a directory also everything below them (children moved)."""
        self._positive.pop(_parent(src), None)
        self._positive.pop(_parent(dst), None)
        for cache in (self._positive, self._negative):
            cache.pop(src, None)
            cache.pop(dst, None)
            if is_dir:
                prefixes = (src + "/", dst + "/")
                for key in [k for k in cache if k.startswith(prefixes)]:
                    del cache[key]

    def invalidate(self, path: str) -> None:
        self._positive.pop(path, None)
        self._negative.pop(path, None)

    def forget_all(self) -> None:
        """Drop every cached answer (the set of reachable nodes changed)."""
        self._positive.clear()
        self._negative.clear()

    def _remember_negative(self, path: str) -> None:
        if self.negative_ttl <= 0:
            return
        self._negative[path] = trio.current_time() + self.negative_ttl
        self._negative.move_to_end(path)
        if len(self._negative) > self._max:
            self._negative.popitem(last=False)

    def statistics(self) -> LocatorStatistics:
        return LocatorStatistics(self._hits, self._negative_hits, self._misses, self._remote,
                                 len(self._positive))


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class _Flight:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.finished = False  # False when done because the searching task was cancelled or failed
        self.result: Location | None = None
