"""The asking side's way to a directory's index: its home, else its backup, else every node.

The root's home is hashed (`Homes.home`); any other directory's home is told by its
parent's home with the lookup of the directory (or with the parent's listing) and kept
here for `home_lease` seconds, revoked by that parent's home when the directory goes
(`index_unhome`). The kernel looks a directory up before any name in it, so once a node
has seen a directory a lookup in it is one round trip to one node; a node that only ever
saw the directory in its own export asks the parent's home once first.

A home that does not answer is replaced by its backup (`index_backup`). Changes made
through the backup are owed to the home, which lists those directories again when it
answers again. A name of a split directory goes to the server of its partition by this
node's map of the directory's partitions (learnt from replies). Only when neither home
nor backup answers does a caller fall back to GMount's search (FloodLocator).

`HomeRouting` holds every cache of the asking side and is the bottom layer of
`IndexLocator`: `lookups` and `changes` build on it.
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Collection
from typing import NamedTuple, Protocol

import trio

from ...errors import PeerUnavailable
from ...protocol import messages as msg
from ...protocol.messages import MAX_PARTITIONS, IndexLookupReply, R, Request
from ..leases import TtlCache
from ..locator import Flights, FloodLocator, FloodPeers, Location
from .directory import DirectoryIndex
from .homes import Homes, home_lease_for, name_hash, partition_of
from .listings import LIST_AHEAD_KEPT, Listing
from .paths import split_parent, under_any
from .peers import Peers

log = logging.getLogger(__name__)

#: Redirects a request for a name of a split directory may meet before the asker gives up on
#: the index (and asks every node): one per level its map is behind, and one from the home.
MAX_HOPS = 8


class LocatorPeers(Peers, FloodPeers, Protocol):
    """The index locator's peers: the index's, and the flooding search's it falls back to."""


class KnownHome(NamedTuple):
    """What this node knows of a directory's home: the node (None: the directory does not exist
    as a directory), and until when that stays true (a lease; 0: not leased). `definite` False:
    the parent's home could not tell (the name is being created, or not every node was listed)."""

    node: str | None
    until: float
    definite: bool = True


class HomeRouting:
    """The asking side's caches, and requests to the home of a directory (see the module).
    The constructor's parameters: `IndexLocator`."""

    def __init__(self, peers: LocatorPeers, tiers: list[tuple[str, ...]], homes: Homes, *, ttl: float = 1.0,
                 negative_ttl: float = 1.0, max_entries: int = 200_000, home_lease: float | None = None,
                 index: DirectoryIndex | None = None) -> None:
        home_lease = home_lease_for(self.lease_for(negative_ttl)) if home_lease is None else home_lease
        self._peers = peers
        self.homes = homes
        self.index = index  # this node's own index (forgotten with its caches on a directory rename)
        # The fallback when a home cannot be asked: it keeps no "not found" (no lease covers it).
        self._flood = FloodLocator(peers, tiers, ttl=ttl, negative_ttl=0.0,
                                   max_entries=max_entries)
        self.tiers = tiers
        self.order = [node for tier in tiers for node in tier]
        self._rank = {node: i for i, node in enumerate(self.order)}
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.home_lease = home_lease
        self._max = max_entries
        self._positive: TtlCache[str, Location] = TtlCache(max_entries)
        self._negative: TtlCache[str, None] = TtlCache(max_entries)  # until the lease's expiry (conservative)
        # directory -> its home, until the lease's expiry; kept a lease longer than it lasts: a
        # change its home missed is owed to the last one known
        self._homes: TtlCache[str, str] = TtlCache(max_entries, keep_for=home_lease)
        self._listings: dict[str, Listing] = {}  # readdir's, or listed ahead
        self._own_changes: dict[str, list[int]] = {}  # directory -> [changes begun here, those under way]
        self._streaks: TtlCache[str, int] = TtlCache(LIST_AHEAD_KEPT)  # directory -> names found there through its home
        self._unlisted: TtlCache[str, float] = TtlCache(LIST_AHEAD_KEPT)  # directory -> when a listing went early
        self._revoked = 0  # counts revocations of homes and listings: an answer older than one is not kept
        self._flights = Flights()
        self._claimed: set[str] = set()        # claimed at their home, being created here
        self._seeded: set[str] = set()         # of those, new directories the claim's server seeded
        self._unclaimed: set[str] = set()      # created while the home was unreachable: flood-announced
        self._just_created: dict[str, Location] = {}
        self._owed: dict[str, set[str]] = {}   # home -> directories whose index missed a change
        self._hits = self._negative_hits = self._misses = self._remote = self._fallbacks = 0
        self._takeovers = self._redirected = self._lists_ahead = 0
        # directory -> a listing of it is being asked for; True once a change here made it stale
        self._listing_stale: dict[str, bool] = {}
        self._parts: dict[str, frozenset[int]] = {}  # split directory -> its partitions as far as known

    @staticmethod
    def lease_for(negative_ttl: float) -> float:
        """The lease a home grants on a "not found": twice what the kernel may keep it, plus margin."""
        return 0.0 if negative_ttl <= 0 else 2 * negative_ttl + 3.0

    def _drop_listing(self, directory: str) -> None:
        """Forget a listing (a change there, made here or told by its home). One dropped before its
        lease ran out marks a directory that changes: not listed ahead for LIST_AHEAD_QUIET seconds.
        A listing still in flight is not kept either (it may predate the change)."""
        if directory in self._listing_stale:
            self._listing_stale[directory] = True
        cached = self._listings.pop(directory, None)
        if cached is not None and cached.until > trio.current_time():
            self._quieten(directory)

    def _quieten(self, directory: str) -> None:
        """No listing ahead in `directory` for LIST_AHEAD_QUIET seconds."""
        now = trio.current_time()
        self._unlisted.put(directory, now, math.inf, now)

    def _forget_homes(self, prefixes: list[str]) -> None:
        self._revoked += 1
        under = under_any(prefixes)
        self._homes.discard_where(under)
        self._negative.discard_where(under)
        for cache in (self._listings, self._parts):
            for key in [k for k in cache if under(k)]:
                del cache[key]
        for prefix in prefixes:
            self._mark_stale(prefix)

    def _mark_stale(self, path: str) -> None:
        self._flights.mark_stale(path)

    # -- talking to homes --------------------------------------------------------

    async def _home_call(self, home: str, request: Request[R]) -> R:
        """One request to a home; first the rebuilds it is owed (changes made while it was away)."""
        if home != self._peers.me:
            self._remote += 1
        owed = self._owed.get(home)
        if owed:
            await self._peers.ask(home, msg.IndexForget(sorted(owed)))
            self._owed.pop(home, None)
        return await self._peers.ask(home, request)

    async def _dir_call(self, directory: str, request: Request[R]) -> R:
        """`request` at the home of `directory`, or at its backup when the home does not answer.
        Raises PeerUnavailable when neither answers (or the home cannot be found)."""
        return (await self._dir_call_via(directory, request))[0]

    async def _dir_call_via(self, directory: str, request: Request[R], home: str | None = None) -> tuple[R, str | None]:
        """`_dir_call`, and the home the backup stood in for (None: the home answered). `home`: the
        directory's home as an asker of this node knows it (msg.Recorded), instead of this node's.

        A name of a split directory goes to the server of its partition by this node's map of
        the directory's partitions (learnt from replies): one round trip while the map is
        current. A server that does not serve the name answers with the partitions it knows of
        (a plain request to the home: ESTALE, then the home is asked for them), and the name
        is asked again where the merged map says; a partition's server that does not answer
        is PeerUnavailable (the caller asks every node instead)."""
        if not isinstance(request, msg.IndexNameRequest):
            return await self._home_call_via(directory, request, home)
        hashed = name_hash(request.name)
        for _ in range(MAX_HOPS):
            bitmap = self._parts.get(directory)
            if bitmap is None:
                try:
                    reply, stood_in_for = await self._home_call_via(directory, request, home)
                except OSError as exc:
                    if isinstance(exc, PeerUnavailable) or exc.errno != errno.ESTALE:
                        raise
                    self._redirected += 1
                    self._parts[directory] = frozenset({0})  # split: the home tells how, at the next hop
                    continue
                if isinstance(reply, IndexLookupReply) and reply.parts:
                    self._learn_parts(directory, reply.parts)
                return reply, stood_in_for
            answer = await self._part_call(directory, partition_of(hashed, bitmap), bitmap, request)
            if isinstance(answer, msg.PartOk):
                self._learn_parts(directory, answer.bitmap)
                return answer.result, None
            self._redirected += 1
            self._learn_parts(directory, answer.bitmap)
        raise PeerUnavailable(await self._home_node(directory), f"the partitions of {directory} still redirected "
                                                                 f"{request.name!r} after {MAX_HOPS} hops")

    async def _part_call(self, directory: str, partition: int, bitmap: Collection[int],
                         request: Request[R]) -> msg.PartOk[R] | msg.PartRedirect:
        """`request` at the server of `partition` of a split directory (no backup: PeerUnavailable)."""
        home = await self._home_node(directory)
        server = home if partition == 0 else self.homes.of_partition(directory, partition)
        try:
            return await self._home_call(server, msg.IndexPart(partition, home, sorted(bitmap), request))
        except PeerUnavailable:
            if not isinstance(request, msg.IndexLookup | msg.IndexList):
                self._owe(server, directory)  # a change it misses: it lists its partitions again when back
            raise

    def _learn_parts(self, directory: str, bitmap: Collection[int]) -> None:
        known = frozenset(int(p) for p in bitmap if 0 <= int(p) < MAX_PARTITIONS)
        if len(known) <= 1 and directory not in self._parts:
            return
        self._parts[directory] = self._parts.get(directory, frozenset()) | known
        if len(self._parts) > self._max:
            self._parts.pop(next(iter(self._parts)))

    async def _home_call_via(self, directory: str, request: Request[R],
                             home: str | None = None) -> tuple[R, str | None]:
        """`request` at the home of `directory` (`home` when given), or at its backup when the home
        does not answer; and the home the backup stood in for (None: the home answered)."""
        home = home or await self._home_node(directory)
        failure: PeerUnavailable
        if not self._peers.is_down(home):
            try:
                return await self._home_call(home, request), None
            except PeerUnavailable as exc:
                failure = exc
        else:
            failure = PeerUnavailable(home, "it did not answer a moment ago")
        backup = self.homes.backup(directory, home)
        if backup is None or backup == home:
            raise failure
        if not isinstance(request, msg.IndexLookup | msg.IndexList):
            self._owe(home, directory)  # a change the home misses: it lists the directory again when back
        self._takeovers += 1
        if backup != self._peers.me:
            self._remote += 1
        log.info("asking %s for %s of %s in place of its home %s: %s", backup, request.op, directory, home, failure)
        try:
            return await self._peers.ask(backup, msg.IndexBackup(home, request)), home
        except PeerUnavailable as exc:
            raise PeerUnavailable(home, f"{failure.reason}; its backup {backup} did not answer either "
                                        f"({exc.reason})") from exc
        except OSError as exc:
            if exc.errno != errno.EHOSTDOWN:  # (the backup serves a partition of it: cannot stand in)
                raise
            raise PeerUnavailable(home, f"{failure.reason}; its backup {backup} cannot stand in: {exc}") from exc

    async def _home_node(self, directory: str) -> str:
        """The home of a directory that exists (PeerUnavailable when that cannot be told)."""
        known = await self._home_of(directory)
        if known.node is None:
            raise PeerUnavailable(self.homes.home(directory), f"{directory} is not a directory its parent's "
                                                              "home knows of")
        return known.node

    async def home_of(self, directory: str) -> str | None:
        """The home of `directory` (None: it is not a directory), asking its parent's home if need be."""
        return (await self._home_of(directory)).node

    async def _home_of(self, directory: str) -> KnownHome:
        if directory == "/" or self.homes.central is not None:
            return KnownHome(self.homes.home(directory), float("inf"))
        now = trio.current_time()
        cached = self._homes.entry(directory)
        if cached is not None and cached[1] > now:
            return KnownHome(*cached)
        parent, name = split_parent(directory)
        revoked = self._revoked
        reply = await self._dir_call(parent, msg.IndexLookup(parent, name, self._peers.me))
        self._note_home(directory, reply.home, reply.home_lease, now, revoked)
        if reply.home is not None:
            return KnownHome(reply.home, now + reply.home_lease)
        if reply.pending or not reply.complete:
            return KnownHome(None, 0.0, definite=False)
        if reply.holders:
            return KnownHome(None, 0.0)  # a file: nothing is in it, but that is not leased
        # no such directory, for as long as the parent's home leases that "not found" (and its
        # parent's home lease, if any: the "not found" came from that home)
        return KnownHome(None, min(now + reply.lease, self._home_expiry(parent)))

    def _note_home(self, directory: str, home: str | None, lease: float, sent: float, revoked: int) -> None:
        """Keep `directory`'s home, leased for `lease` seconds from `sent` (unless a revocation came
        since the answer was asked for: `revoked` as it was then)."""
        if home is None or lease <= 0 or revoked != self._revoked:
            return
        self._homes.put(directory, home, sent + lease, trio.current_time())

    def _home_expiry(self, directory: str) -> float:
        if directory == "/" or self.homes.central is not None:
            return float("inf")
        until = self._homes.until(directory)
        return until if until is not None else 0.0

    def _owe(self, home: str, directory: str) -> None:
        self._owed.setdefault(home, set()).add(directory)

    def _owe_for(self, directory: str, home: str | None) -> None:
        """`home` (None: the home of `directory` as last known here) missed a change there."""
        if home is not None:
            self._owe(home, directory)
        else:
            self._owe_home_of(directory)

    def _owe_home_of(self, directory: str) -> None:
        """The home of `directory` (as last known) missed a change there."""
        if directory == "/" or self.homes.central is not None:
            self._owe(self.homes.home(directory), directory)
            return
        home = self._homes.peek(directory)
        if home is not None:
            self._owe(home, directory)

    async def flush_owed(self) -> None:
        """Tell the homes that missed changes to list those directories again, and send the backups
        the records and the names of owned directories batched for them (the daemon calls this
        every second; a home that is still unreachable stays owed)."""
        if self.index is not None:
            await self.index.flush_records()
            await self.index.flush_names()
        for home in list(self._owed):
            directories = self._owed.get(home)
            if not directories or self._peers.is_down(home):
                continue
            try:
                await self._peers.ask(home, msg.IndexForget(sorted(directories)))
            except OSError as exc:
                log.info("home %s still misses changes under %s: %s", home, sorted(directories), exc)
                continue
            if self._owed.get(home) is directories:
                del self._owed[home]
