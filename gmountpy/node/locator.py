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

import errno
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import trio

from .._trio import open_nursery
from ..errors import PeerUnavailable
from ..protocol import messages as msg
from ..protocol.attr import Attr
from ..protocol.messages import LocateReply, R, ReplicaSource, Request
from .leases import TtlCache

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Location:
    """A node that holds a path, with the path's attributes on that node."""

    node: str
    attr: Attr
    replica_of: str | None = None  # set when this copy is a staged replica of that node's file


class AbsentForNow(FileNotFoundError):
    """No reachable node holds the path, but some node could not be asked.

    Not a cacheable "no such file": the answer may change as soon as that
    node answers again, so neither the daemon nor the kernel keeps it.
    """


#: How long a create waits for the other nodes to drop their "not found" (unreachable
#: or slower nodes keep theirs until negative_ttl: see README, Consistency).
ANNOUNCE_TIMEOUT = 1.0


class FloodPeers(Protocol):
    """What the flooding search needs of the peer pool (PeerPool, or a test's in-memory network)."""

    me: str

    async def ask(self, node: str, request: Request[R], *, timeout: float | None = None) -> R: ...
    def is_down(self, node: str) -> bool: ...


class Locator(Protocol):
    """What the namespace needs from a locator (docs/design.md: the locator seam).

    The `announce_*` calls are made after a change to an export has happened (or, for
    `claim`, before a create on this node) and return once every node that must know
    of it knows: they carry the hand-off contract, whatever the lookup scheme. `change`
    makes a change to a file on its one holder (chmod, utimens, truncate, unlink, or a
    rename) and announces it, as one step: the locator may have the holder announce it.
    """

    order: list[str]  # every node, in this node's lookup order

    def rank(self, node: str) -> int: ...
    async def find(self, path: str, *, fresh: bool = False) -> Location | None: ...
    async def find_all(self, path: str, *, strict: bool = False) -> list[Location]: ...
    async def listing(self, directory: str) -> list[tuple[str, list[Location]]] | None: ...
    async def claim(self, path: str, *, is_dir: bool = False) -> Location | None: ...
    async def withdraw(self, path: str) -> None: ...
    async def announce_created(self, path: str, is_dir: bool = False) -> None: ...
    async def announce_changed(self, path: str, location: Location) -> None: ...
    async def announce_removed(self, path: str, nodes: list[str], is_dir: bool = False) -> None: ...
    async def change(self, node: str, path: str, request: Request[R]) -> R: ...
    async def announce_renamed(self, src: str, dst: str, is_dir: bool, holders: list[str]) -> None: ...
    async def announce_unsure(self, paths: list[str]) -> None: ...
    def statistics(self) -> LocatorStatistics: ...
    def learn(self, path: str, location: Location) -> None: ...
    def note_created(self, path: str, location: Location) -> None: ...
    def note_removed(self, path: str) -> None: ...
    def note_renamed(self, src: str, dst: str, is_dir: bool) -> None: ...
    def invalidate(self, path: str) -> None: ...
    def forget_absent(self, path: str, is_dir: bool = False) -> None: ...
    def forget_all(self) -> None: ...
    async def confirm_replica(self, path: str) -> bool: ...


class _Replies:
    """What the nodes asked about one path said: holders, errors, and who could not be asked."""

    def __init__(self) -> None:
        self.found: dict[str, LocateReply | None] = {}
        self.errors: dict[str, OSError] = {}       # answered, but not "here" or "not here"
        self.unreachable: dict[str, PeerUnavailable] = {}

    def get(self, node: str) -> LocateReply | None:
        return self.found.get(node)


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
        peers: FloodPeers,
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
        self._positive: TtlCache[str, Location] = TtlCache(max_entries)
        self._negative: TtlCache[str, None] = TtlCache(max_entries)
        # The node last seen holding each path, kept past the TTL: if that node stops
        # answering, a lookup says EIO (the file is there but unreachable), not ENOENT.
        self._last_holder: TtlCache[str, str] = TtlCache(max_entries)
        # Staged replicas found unchanged at their source: a lookup (stat, `where`) trusts that for
        # `ttl`, as it trusts any attributes; an open asks the source again (confirm_replica).
        self._replicas_checked: TtlCache[str, ReplicaSource] = TtlCache(max_entries)
        self._flights = Flights()
        self._hits = self._negative_hits = self._misses = self._remote = 0

    # -- the search ----------------------------------------------------------

    async def find(self, path: str, *, fresh: bool = False) -> Location | None:
        """The nearest holder; None when every node answered "not here".

        `fresh` skips the caches (a create must know about every reachable node now).
        Raises the error of a node that answered neither yes nor no (EACCES, EIO, ...),
        PeerUnavailable (EIO) when the node last known to hold the path cannot be
        reached, and AbsentForNow when no reachable node has it but some node could
        not be asked. None of those is cached.
        """
        now = trio.current_time()
        cached = self._positive.get(path, now)
        if not fresh and cached is not None:
            self._hits += 1
            return cached
        expires = self._negative.until(path)
        if not fresh and expires is not None and expires > now:
            self._negative_hits += 1
            return None
        shared = await self._flights.wait(path, share=not fresh)  # someone may be searching already
        if shared is not None:
            return shared.result
        self._misses += 1
        with self._flights.fly(path) as flight:
            flight.result = await self._search(path, self._last_holder.peek(path))
        if flight.result is None:
            if not flight.stale:  # a create elsewhere raced with this search: do not keep its "no"
                self._remember_negative(path)
        else:
            self.learn(path, flight.result)
        return flight.result

    async def _search(self, path: str, last_holder: str | None = None) -> Location | None:
        errors: dict[str, OSError] = {}
        unreachable: dict[str, PeerUnavailable] = {}
        for tier in self.tiers:
            replies = await self._ask(tier, path)
            errors.update(replies.errors)
            unreachable.update(replies.unreachable)
            for node in tier:
                reply = replies.get(node)
                if reply is None:
                    continue
                replica = reply.replica
                if replica is None:
                    return Location(node, reply.attr)
                # A staged replica serves reads only on its own node, and only while
                # its source is unchanged; elsewhere the source is the holder.
                if node == self._peers.me and await self.replica_still_valid(path, replica):
                    return Location(node, reply.attr, replica_of=replica.node)
        # Nobody said "here". Only a unanimous "not here" is an answer that may be cached.
        if errors:
            node, error = min(errors.items(), key=lambda item: self.rank(item[0]))
            raise OSError(error.errno, f"looking up {path} on node {node}: {error.strerror or error}")
        if last_holder is not None and last_holder in unreachable:
            raise unreachable[last_holder]  # the holder we knew is dead or hangs: EIO, not ENOENT
        timed_out = [exc for exc in unreachable.values() if exc.errno == errno.ETIMEDOUT]
        if timed_out:
            raise timed_out[0]  # a node that hangs may hold it: we cannot say "no such file"
        if unreachable:
            raise AbsentForNow(errno.ENOENT, f"no reachable node holds {path} "
                                             f"({', '.join(sorted(unreachable))} unreachable)")
        return None

    async def replica_still_valid(self, path: str, replica: ReplicaSource, *, exact: bool = False) -> bool:
        """Is the source of this node's replica of `path` unchanged? Asks the source, unless it said
        so within `ttl` and not `exact` (an open is exact: close-to-open)."""
        now = trio.current_time()
        if not exact and self._replicas_checked.get(path, now) == replica:
            return True
        try:
            attr = await self._peers.ask(replica.node, msg.Lookup(path))
        except OSError:
            return False  # cannot vouch for it: use the source (or fail) rather than risk stale data
        if attr is not None and (attr.size, attr.mtime_ns) == (replica.size, replica.mtime_ns):
            self._replicas_checked.put(path, replica, now + self.ttl, now)
            return True
        self._replicas_checked.pop(path)
        log.info("replica of %s from %s is stale; dropping it", path, replica.node)
        try:
            await self._peers.ask(self._peers.me, msg.DropReplica(path, replica.size, replica.mtime_ns))
        except OSError as exc:
            log.warning("could not drop stale replica %s: %s", path, exc)
        return False

    async def confirm_replica(self, path: str) -> bool:
        """Before an open serves this node's replica of `path`: False when its source changed (the
        replica is dropped; look the path up again). True when `path` here is no replica."""
        reply = await self._peers.ask(self._peers.me, msg.Locate(path))
        if reply is None or reply.replica is None:
            return True
        return await self.replica_still_valid(path, reply.replica, exact=True)

    async def listing(self, directory: str) -> list[tuple[str, list[Location]]] | None:
        """No one node knows a whole directory here: None, the namespace asks every node."""
        return None

    async def find_all(self, path: str, *, strict: bool = False) -> list[Location]:
        """Every holder, nearest first, with valid replicas marked (asks all nodes; for `where`).

        `strict` (for unlink and rename) raises PeerUnavailable when a node could not be
        asked, and the error of a node that could not answer: a holder we did not see
        would bring the old file back when it answers again.
        """
        replies = await self._ask(tuple(self.order), path)
        if strict and (replies.unreachable or replies.errors):
            for node in self.order:
                if node in replies.unreachable:
                    exc = replies.unreachable[node]
                    raise PeerUnavailable(node, f"{exc.reason}; it may hold {path}, so the change "
                                                f"is refused until it is back (`gmount up`)")
                if node in replies.errors:
                    raise replies.errors[node]
        found = []
        for node in self.order:
            reply = replies.get(node)
            if reply is None:
                continue
            replica = reply.replica
            if replica is None:
                found.append(Location(node, reply.attr))
                continue
            source_reply = replies.get(replica.node)
            if source_reply is not None and source_reply.replica is None and \
                    (source_reply.attr.size, source_reply.attr.mtime_ns) == (replica.size, replica.mtime_ns):
                found.append(Location(node, reply.attr, replica_of=replica.node))
        if not found and not replies.unreachable and not replies.errors:
            self._remember_negative(path)
        return found

    async def _ask(self, nodes: tuple[str, ...], path: str) -> _Replies:
        """Ask nodes in parallel whether they hold `path`; errors and unreachable nodes are kept apart."""
        replies = _Replies()

        async def ask(node: str) -> None:
            if node != self._peers.me:
                self._remote += 1
            try:
                replies.found[node] = await self._peers.ask(node, msg.Locate(path))
            except PeerUnavailable as exc:
                replies.unreachable[node] = exc
            except OSError as exc:
                log.info("lookup of %s on %s failed: %s", path, node, exc)
                replies.errors[node] = exc

        async with open_nursery() as nursery:
            for node in nodes:
                if self._peers.is_down(node):
                    replies.unreachable[node] = PeerUnavailable(node, "marked down after a failure")
                else:
                    nursery.start_soon(ask, node)
        return replies

    # -- changes: every reachable node is told of a new name ----------------------------

    async def claim(self, path: str, *, is_dir: bool = False) -> Location | None:
        """Before a create here: the holder if any reachable node has `path` (asks them all, now)."""
        try:
            return await self.find(path, fresh=True)
        except AbsentForNow:
            return None  # unreachable nodes cannot be asked; a twin there is possible (README)

    def last_holder(self, path: str) -> str | None:
        """The node last seen holding `path` (kept past the TTL), if any."""
        return self._last_holder.peek(path)

    async def withdraw(self, path: str) -> None:
        """The create after `claim` failed: nothing was announced, nothing to undo."""

    async def announce_created(self, path: str, is_dir: bool = False) -> None:
        """Tell every reachable node, in parallel, that `path` exists now (hand-off rule 1).

        Waits at most ANNOUNCE_TIMEOUT: a node that does not answer in time (or is down)
        keeps its "not found" until negative_ttl, as documented.
        """
        async def tell(node: str) -> None:
            try:
                with trio.move_on_after(ANNOUNCE_TIMEOUT):
                    await self._peers.ask(node, msg.Created(path, is_dir))
            except OSError as exc:
                log.info("could not tell %s that %s was created: %s", node, path, exc)

        async with open_nursery() as nursery:
            for node in self.order:
                if node != self._peers.me and not self._peers.is_down(node):
                    nursery.start_soon(tell, node)

    async def announce_changed(self, path: str, location: Location) -> None:
        """Attributes changed: nobody else keeps them beyond the TTL, nothing to send."""

    async def announce_removed(self, path: str, nodes: list[str], is_dir: bool = False) -> None:
        """Removed from `nodes`: searches ask the disks, nothing to send."""

    async def change(self, node: str, path: str, request: Request[R]) -> R:
        """`request`, a change to `path` on its one holder `node`, announced as announce_changed,
        announce_removed or (a rename) announce_renamed would."""
        result = await self._peers.ask(node, request)
        if isinstance(request, msg.Rename):
            await self.announce_renamed(request.src, request.dst, False, [node])
        return result

    async def announce_renamed(self, src: str, dst: str, is_dir: bool, holders: list[str]) -> None:
        await self.announce_created(dst, is_dir)  # the new name must not be "not found" anywhere

    async def announce_unsure(self, paths: list[str]) -> None:
        """A change failed half-way: searches ask the disks, nothing to repair."""

    # -- being told --------------------------------------------------------

    def rank(self, node: str) -> int:
        return self._rank.get(node, len(self._rank))

    def learn(self, path: str, location: Location) -> None:
        self._negative.pop(path)
        now = trio.current_time()
        self._positive.put(path, location, now + self.ttl, now)
        self._last_holder.put(path, location.replica_of or location.node, math.inf, now)

    def note_created(self, path: str, location: Location) -> None:
        self.learn(path, location)
        self._positive.pop(_parent(path))  # the directory's nlink, mtime and ctime changed

    def note_removed(self, path: str) -> None:
        self._positive.pop(path)
        self._positive.pop(_parent(path))
        self._last_holder.pop(path)
        self._mark_stale(path)
        self._remember_negative(path)

    def note_renamed(self, src: str, dst: str, is_dir: bool) -> None:
        """Forget both names; for a directory also everything below them (children moved)."""
        self._positive.pop(_parent(src))
        self._positive.pop(_parent(dst))
        caches: tuple[TtlCache[str, Location], TtlCache[str, None], TtlCache[str, str]] = (
            self._positive, self._negative, self._last_holder)
        prefixes = (src + "/", dst + "/")
        self._replicas_checked.pop(src)
        self._replicas_checked.pop(dst)
        for cache in caches:
            cache.pop(src)
            cache.pop(dst)
            if is_dir:
                cache.discard_where(lambda key: key.startswith(prefixes))
        self._mark_stale(src)
        self._mark_stale(dst)

    def invalidate(self, path: str) -> None:
        self._positive.pop(path)
        self._negative.pop(path)
        self._replicas_checked.pop(path)
        self._mark_stale(path)

    def forget_absent(self, path: str, is_dir: bool = False) -> None:
        """`path` was just created elsewhere: drop "not found" for it and for its parents.

        For a directory renamed into place also for everything below it. A search under
        way for one of them may have asked the creator before the create; its answer is
        not kept.
        """
        self._positive.pop(path)
        drop_absent(self._negative, self._flights, path, is_dir)

    def _mark_stale(self, path: str) -> None:
        self._flights.mark_stale(path)

    def forget_all(self) -> None:
        """Drop every cached answer (the set of reachable nodes changed)."""
        self._positive.clear()
        self._negative.clear()
        self._replicas_checked.clear()

    def _remember_negative(self, path: str) -> None:
        if self.negative_ttl <= 0:
            return
        now = trio.current_time()
        self._negative.put(path, None, now + self.negative_ttl, now)

    def statistics(self) -> LocatorStatistics:
        return LocatorStatistics(self._hits, self._negative_hits, self._misses, self._remote,
                                 len(self._positive))


def drop_absent(negative: TtlCache[str, None], flights: Flights, path: str, is_dir: bool) -> None:
    """`path` exists now: drop "not found" for it and for its parents (and, for a directory,
    for everything below it); a search of one of them under way keeps no answer."""
    if is_dir:
        prefix = path + "/"
        negative.discard_where(lambda key: key.startswith(prefix))
    while path not in ("/", ""):
        negative.pop(path)
        flights.mark_stale(path)
        path = _parent(path)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class Flight:
    """One search for a path under way (see `Flights`)."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.finished = False  # False when done because the searching task was cancelled or failed
        self.stale = False     # the path changed while searching: the answer is not cached
        self.result: Location | None = None


class Flights:
    """Searches under way, one per path: a later search of the same path waits for the first
    one's answer instead of asking the nodes again (singleflight)."""

    def __init__(self) -> None:
        self._under_way: dict[str, Flight] = {}

    async def wait(self, path: str, *, share: bool) -> Flight | None:
        """Wait while `path` is being searched for; with `share`, the search that finished with an
        answer meanwhile (None: search yourself). A search that was cancelled (an interrupted
        caller) or failed has no answer: its "no answer" is not a "no such file"."""
        while (flight := self._under_way.get(path)) is not None:
            await flight.done.wait()
            if flight.finished and share:
                return flight
        return None

    @contextmanager
    def fly(self, path: str) -> Iterator[Flight]:
        """The search of `path` this caller makes: finished when the block ends without an error."""
        flight = self._under_way[path] = Flight()
        try:
            yield flight
            flight.finished = True
        finally:
            del self._under_way[path]
            flight.done.set()

    def mark_stale(self, path: str) -> None:
        """`path` changed: the answer of a search of it under way is not to be kept."""
        flight = self._under_way.get(path)
        if flight is not None:
            flight.stale = True
