"""Finding a path through its directory's home: own export, caches, then one round trip.

A node looks a path up in its own export first (0 messages), then in its short caches
and leased listings (0), then asks the home (1 round trip); a miss is the home's
negative answer, never a search of every node. A "not found" is kept only while the
home's lease on it outlives what the kernel may keep (`negative_ttl`), so a create's
revocation always reaches every node that may still answer "not found". When the home
cannot answer exactly, GMount's search answers, with an uncacheable ENOENT for misses.
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Sequence

import trio

from ..._trio import open_nursery
from ...errors import PeerUnavailable
from ...protocol import messages as msg
from ...protocol.messages import IndexHolder, IndexListReply, IndexLookupReply, ReplicaSource
from ..locator import AbsentForNow, Flight, Location, drop_absent
from .listings import LIST_AHEAD_AFTER, LIST_AHEAD_MAX, LIST_AHEAD_QUIET, LISTINGS_KEPT, Listing
from .paths import join, split_parent
from .routing import MAX_HOPS, HomeRouting

log = logging.getLogger(__name__)


class Lookups(HomeRouting):
    """`IndexLocator`'s lookups and the caches they keep (see the module)."""

    async def _local(self, path: str) -> Location | None:
        """This node's own export (no message): the file itself, or a still-valid staged replica."""
        reply = await self._peers.ask(self._peers.me, msg.Locate(path))
        if reply is None:
            return None
        if reply.replica is None:
            return Location(self._peers.me, reply.attr)
        if await self._flood.replica_still_valid(path, reply.replica):
            return Location(self._peers.me, reply.attr, replica_of=reply.replica.node)
        return None

    async def find(self, path: str, *, fresh: bool = False) -> Location | None:
        """The nearest holder; None when the home says no node has it (leased, so cacheable).

        Raises AbsentForNow (ENOENT, not cached by anyone) when the answer is not a leased
        one: the home could not be asked or not every node could be listed.
        """
        local = await self._local(path)
        if local is not None:
            return local
        if self.index is not None and await self.index.owned_now(split_parent(path)[0]):
            # its directory is owned here: this export is the whole of it, and a job may create the
            # name here any moment without telling anyone -- "not found", but kept by nobody
            raise AbsentForNow(errno.ENOENT, f"no such file in {split_parent(path)[0]} (owned by this node)")
        now = trio.current_time()
        if not fresh:
            cached = self._positive.get(path, now)
            if cached is not None:
                self._hits += 1
                return cached
            until = self._negative.until(path)
            if until is not None and until - now >= self.negative_ttl + 1.5:
                self._negative_hits += 1
                return None
            listed = self._listed(path, now)
            if listed is not None:
                self._hits += 1
                self._flood.learn(path, listed)  # its last holder: a claim while every home is cut off asks it
                return listed
        shared = await self._flights.wait(path, share=not fresh)
        if shared is not None:
            return shared.result
        self._misses += 1
        with self._flights.fly(path) as flight:
            flight.result = await self._ask_home(path, flight)
        if flight.result is not None:
            self.learn(path, flight.result)
        return flight.result

    async def _ask_home(self, path: str, flight: Flight) -> Location | None:
        directory, name = split_parent(path)
        sent = trio.current_time()
        revoked = self._revoked
        try:
            parent = await self._home_of(directory)
            if parent.node is None:  # no such directory (or a file): nothing in it either
                if not parent.definite:
                    return await self._fall_back(path, f"the home of {split_parent(directory)[0]} could not "
                                                       f"tell whether {directory} is a directory")
                if parent.until - sent >= self.negative_ttl + 1.5 and not flight.stale:
                    self._remember_negative(path, parent.until)
                return None  # definite; kept only under the lease of the parent's "not found"
            home = parent.node
            reply = await self._lookup_at_home(directory, name, sent, revoked,
                                               ahead=self._worth_listing(directory) and not flight.stale)
        except PeerUnavailable as exc:
            return await self._fall_back(path, f"the home of {directory} and its backup are unreachable "
                                               f"({exc.reason})")
        self._note_home(path, reply.home, reply.home_lease, sent, revoked)
        found = self._nearest(reply.holders)
        self._streak(directory, found is not None,
                     not reply.parts and (reply.size or LIST_AHEAD_MAX + 1) <= LIST_AHEAD_MAX)
        if found is not None:
            return await self._from_holder_if_linked(path, found)
        if reply.pending:
            raise AbsentForNow(errno.ENOENT, f"{path} is being created (home {home})")
        if not reply.complete:
            return await self._fall_back(path, f"the home {home} could not list {directory} on every node")
        lease = reply.lease
        until = min(sent + lease, self._home_expiry(directory))  # no longer than this home is its home
        if lease > 0 and until - sent > 0 and not flight.stale:
            self._remember_negative(path, until)
        if lease <= 0:
            raise AbsentForNow(errno.ENOENT, f"no node holds {path} (home {home} or its backup, no lease)")
        return None

    async def _lookup_at_home(self, directory: str, name: str, sent: float, revoked: int, *,
                              ahead: bool) -> IndexLookupReply:
        """`index_lookup` at the directory's home; `ahead`: with the whole listing, kept under its
        lease unless a change here or a revocation came meanwhile (`sent`, `revoked`: as then)."""
        if not ahead:
            return await self._dir_call(directory, msg.IndexLookup(directory, name, self._peers.me, False))
        self._listing_stale.setdefault(directory, False)
        try:
            reply = await self._dir_call(directory, msg.IndexLookup(directory, name, self._peers.me, True))
            if reply.listing is not None:
                self._lists_ahead += 1
                self._keep_listing(directory, reply.listing, sent, revoked)
        finally:
            self._listing_stale.pop(directory, None)
        if directory not in self._listings:  # not leased (a backup answered, a change meanwhile, ...)
            self._quieten(directory)
        return reply

    async def _from_holder_if_linked(self, path: str, found: Location) -> Location:
        """`found` with its holder's attributes when the file has several names (hard links).

        Such a file changes through any of its names (a write, a chmod, an unlink of another
        name), and a home hears only of changes made through the names it indexes, so its
        record may be stale. One more round trip, for hard-linked files only; a record found
        stale is corrected at its home.
        """
        if found.attr.is_dir or found.attr.nlink <= 1:
            return found
        attr = await self._peers.ask(found.node, msg.Lookup(path))
        if attr is None:
            raise AbsentForNow(errno.ENOENT, f"{path} was removed from node {found.node} just now")
        fresh = Location(found.node, attr)
        if attr._replace(atime_ns=0) != found.attr._replace(atime_ns=0):
            await self.announce_changed(path, fresh)
        return fresh

    async def announce_changed(self, path: str, location: Location) -> None:
        directory, name = split_parent(path)
        self._drop_listing(directory)  # not revoked by the home: this node is the asker
        if location.node == self._peers.me and self.index is not None and await self.index.owned_now(directory):
            return  # owned here: whoever asks first ends the ownership, and this export is listed then
        try:
            await self._dir_call(directory, msg.IndexSet(directory, name, location.node, location.attr,
                                                         location.replica_of, location.attr.is_dir, self._peers.me))
        except OSError as exc:
            log.info("could not record the change of %s at the home of %s: %s", path, directory, exc)
            self._owe_home_of(directory)

    def _streak(self, directory: str, found: bool, listable: bool) -> None:
        """Count names found in `directory` through its home (a miss does not count; a directory
        too big or split to list ends the streak)."""
        if not listable:
            self._streaks.pop(directory)
            return
        if not found:
            return
        self._streaks.put(directory, (self._streaks.peek(directory) or 0) + 1, math.inf, trio.current_time())

    def _listed(self, path: str, now: float) -> Location | None:
        """The nearest holder of `path` by a listing of its directory still under lease, if it lists
        the name; None otherwise (not listed, or no listing: the home is asked)."""
        directory, name = split_parent(path)
        cached = self._listings.get(directory)
        if cached is None or cached.until <= now or name in cached.unsure:
            return None
        own = [loc for loc in self._locations(cached.rows.get(name, ())) if loc.replica_of is None]
        if not own or (not own[0].attr.is_dir and own[0].attr.nlink > 1):
            return None  # not listed (a replica: `_local` said), or hard-linked: its holder has the attributes
        return own[0]

    def _locations(self, holders: Sequence[IndexHolder]) -> list[Location]:
        """A listed name's holders as the search lists them: what is reachable (a holder known to be
        down is left out), staged replicas only on their own node; nearest first."""
        return sorted((Location(node, attr, replica_of) for node, attr, replica_of in holders
                       if (replica_of is None or node == self._peers.me) and not self._peers.is_down(node)),
                      key=lambda loc: self.rank(loc.node))

    def _worth_listing(self, directory: str) -> bool:
        """Ask for the whole listing with this lookup (see LIST_AHEAD_AFTER)? Not while one is kept
        (a miss there asks the home, which need not send the listing again)."""
        if (self._streaks.peek(directory) or 0) < LIST_AHEAD_AFTER:
            return False
        kept = self._listings.get(directory)
        if kept is not None and kept.until > trio.current_time():
            return False
        dropped = self._unlisted.peek(directory)
        return dropped is None or trio.current_time() - dropped >= LIST_AHEAD_QUIET

    async def _fall_back(self, path: str, why: str) -> Location | None:
        """GMount's search, past every cache; its "not found" is not leased, so not cacheable."""
        self._fallbacks += 1
        log.info("looking up %s by asking every node: %s", path, why)
        found = await self._flood.find(path, fresh=True)
        if found is None:
            raise AbsentForNow(errno.ENOENT, f"no node holds {path} ({why}; every node was asked)")
        return found

    def _nearest(self, holders: Sequence[IndexHolder]) -> Location | None:
        """The nearest holder this node does not know to be down. Raises PeerUnavailable (EIO) when
        every holder is known to be down: the file exists but cannot be reached, it is not absent."""
        best: Location | None = None
        down: str | None = None
        for node, attr, replica_of in holders:
            if replica_of is not None:
                continue  # a replica serves only its own node (asked first)
            if self._peers.is_down(node):
                down = node
                continue
            if best is None or self.rank(node) < self.rank(best.node):
                best = Location(node, attr)
        if best is None and down is not None:
            raise PeerUnavailable(down, "it holds the file but is down; try again when it is back")
        return best

    async def find_all(self, path: str, *, strict: bool = False) -> list[Location]:
        """Every holder, nearest first, from the home (1 round trip), or none under the home's
        leased "not found" (a rename's target, just looked up by the kernel: the home tells this
        node of a create before that create returns, so the lease is exact). When the home cannot
        answer exactly (unreachable, a node not listed, a staged replica whose validity only its
        source can tell), GMount's search answers instead. This node's own export is always
        looked at too: a file written straight into it is a holder before a scan tells the home.
        `strict` (unlink, rmdir, rename): PeerUnavailable when the home's backup answers in its
        place, or when a node could not be asked (the search's own `strict`)."""
        local = await self._local(path)
        now = trio.current_time()
        until = self._negative.until(path)
        if local is None and until is not None and until > now:
            self._negative_hits += 1
            return []
        directory, name = split_parent(path)
        listed = self._listings.get(directory)
        holders: Sequence[IndexHolder]
        if listed is not None and listed.until > now and name in listed.rows and name not in listed.unsure:
            self._hits += 1  # a leased listing is as exact as its home: any change elsewhere revokes it
            holders = listed.rows[name]
        else:
            stood_in_for: str | None = None
            try:
                reply: IndexLookupReply | None
                reply, stood_in_for = await self._dir_call_via(directory, msg.IndexLookup(directory, name, None))
            except PeerUnavailable:
                reply = None
            if strict and stood_in_for is not None:
                # the backup answers from its own listing, not told of changes at the home since:
                # a change that missed a holder would leave that copy behind (docs/failures.md)
                raise PeerUnavailable(stood_in_for, f"it did not answer for {directory} and may hold {path}, so "
                                                    f"the change is refused until it is back (`gmount up`)")
            if reply is None or not reply.complete or reply.pending:
                self._fallbacks += 1
                return await self._flood.find_all(path, strict=strict)
            holders = reply.holders
        if any(holder.replica_of is not None for holder in holders):
            # whether a staged replica is still there and valid only its node and its source can tell (a
            # replica dropped as stale, or removed outside the mounts, may still be on the home's record)
            self._fallbacks += 1
            return await self._flood.find_all(path, strict=strict)
        found = [Location(holder.node, holder.attr) for holder in holders]
        if local is not None and local.replica_of is None and all(loc.node != local.node for loc in found):
            found.append(local)
        return sorted(found, key=lambda loc: self.rank(loc.node))

    async def listing(self, directory: str) -> list[tuple[str, list[Location]]] | None:
        """The whole directory from its home in one round trip: each name with its holders, nearest
        first (staged replicas only of this node). Kept while the home's listing lease lasts (any
        change there revokes it). None when the home cannot answer exactly: ask every node."""
        now = trio.current_time()
        cached = self._listings.get(directory)
        if cached is not None and cached.until > now and not cached.unsure:
            self._hits += 1
            return self._entries(cached)
        revoked = self._revoked
        self._listing_stale.setdefault(directory, False)
        try:
            return await self._ask_listing(directory, now, revoked)
        finally:
            self._listing_stale.pop(directory, None)

    async def _ask_listing(self, directory: str, now: float, revoked: int) -> list[tuple[str, list[Location]]] | None:
        """`listing` past the cache: one `index_list` (one per partition of a split directory)."""
        try:
            reply = await self._dir_call(directory, msg.IndexList(directory, self._peers.me))
            if reply.parts:
                reply = await self._list_partitions(directory, reply)
        except PeerUnavailable as exc:
            self._fallbacks += 1
            log.info("listing %s from every node: %s", directory, exc)
            return None
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            return None  # too big for one reply: every node pages through its own
        if not reply.complete:
            self._fallbacks += 1
            return None
        if not reply.exists:
            raise FileNotFoundError(errno.ENOENT, f"no node holds {directory}")
        return self._keep_listing(directory, reply, now, revoked) or []

    def _keep_listing(self, directory: str, reply: IndexListReply, now: float,
                      revoked: int) -> list[tuple[str, list[Location]]] | None:
        """A home's listing as entries, kept under its lease unless a revocation or a change here
        came since it was asked for (`now`, `revoked`: as they were then; `_listing_stale`). None when
        it is not complete (the home could not list every node)."""
        if not reply.complete:
            return None
        for name, _, home in reply.entries:
            if home is not None:
                self._note_home(join(directory, name), home, reply.home_lease, now, revoked)
        listing = Listing({row.name: row.holders for row in reply.entries}, now + reply.lease)
        lease = reply.lease
        stale = self._listing_stale.pop(directory, True)  # a second listing in flight: not kept either
        if lease > 0 and revoked == self._revoked and not stale:
            if len(self._listings) >= LISTINGS_KEPT and directory not in self._listings:
                current = trio.current_time()
                for expired in [d for d, kept in self._listings.items() if kept.until <= current]:
                    del self._listings[expired]
                while len(self._listings) >= LISTINGS_KEPT:
                    del self._listings[next(iter(self._listings))]
            self._listings[directory] = listing
        return self._entries(listing)

    def _entries(self, listing: Listing) -> list[tuple[str, list[Location]]]:
        """A listing as readdir gives it: each name with its holders as `_locations` has them."""
        entries = [(name, self._locations(holders)) for name, holders in listing.rows.items()]
        return [(name, locations) for name, locations in entries if locations]

    async def _list_partitions(self, directory: str, first: IndexListReply) -> IndexListReply:
        """A split directory's listing: the home's (`first`) and every other partition server's,
        asked in parallel (one round trip each; more rounds only for partitions learnt from
        their replies). Complete and leased only when every part is."""
        home = await self._home_node(directory)
        self._learn_parts(directory, first.parts or ())
        replies: dict[str, IndexListReply] = {home: first}
        for _ in range(MAX_HOPS):
            bitmap = sorted(self._parts.get(directory, frozenset({0})))
            wanted: dict[str, int] = {}
            for partition in bitmap:
                server = home if partition == 0 else self.homes.of_partition(directory, partition)
                if server not in replies:
                    wanted.setdefault(server, partition)
            if not wanted:
                break

            async def ask(server: str, partition: int, bitmap: list[int]) -> None:
                answer = await self._home_call(server, msg.IndexPart(partition, home, bitmap,
                                                                     msg.IndexList(directory, self._peers.me)))
                self._learn_parts(directory, answer.bitmap)
                if isinstance(answer, msg.PartOk):
                    replies[server] = answer.result

            async with open_nursery() as nursery:
                for server, partition in wanted.items():
                    nursery.start_soon(ask, server, partition, bitmap)
        else:
            raise PeerUnavailable(home, f"the partitions of {directory} did not settle")
        parts = list(replies.values())
        return IndexListReply(tuple(row for reply in parts for row in reply.entries),
                              complete=all(reply.complete for reply in parts),
                              exists=any(reply.exists for reply in parts),
                              lease=min(reply.lease for reply in parts), home_lease=first.home_lease)

    # -- caches --------------------------------------------------------------------

    def rank(self, node: str) -> int:
        return self._rank.get(node, len(self._rank))

    def learn(self, path: str, location: Location) -> None:
        self._flood.learn(path, location)  # its last holder: if that node dies, the search says EIO
        self._negative.pop(path)
        now = trio.current_time()
        self._positive.put(path, location, now + self.ttl, now)

    def note_created(self, path: str, location: Location) -> None:
        self._just_created[path] = location
        if len(self._just_created) > 1024:  # a create that never announced (failed after): bounded
            self._just_created.pop(next(iter(self._just_created)))
        self.learn(path, location)
        self._positive.pop(split_parent(path)[0])
        self._drop_listing(split_parent(path)[0])

    def note_removed(self, path: str) -> None:
        """After an unlink or rmdir here (the listing of its directory: see `change`, `announce_removed`)."""
        self._positive.pop(path)
        self._positive.pop(split_parent(path)[0])
        self._mark_stale(path)

    def note_renamed(self, src: str, dst: str, is_dir: bool) -> None:
        """After a rename here (the listings of its directories: see `change`, `announce_renamed`)."""
        self._forget_cached([src, dst], subtree=is_dir, listings=False)
        for path in (src, dst):
            self._positive.pop(split_parent(path)[0])
        if is_dir:
            self._forget_homes([src, dst])

    def _forget_cached(self, paths: list[str], subtree: bool = False, listings: bool = True) -> None:
        for path in paths:
            self._positive.pop(path)
            self._negative.pop(path)
        if subtree:
            below = tuple(path + "/" for path in paths)
            self._positive.discard_where(lambda key: key.startswith(below))
            self._negative.discard_where(lambda key: key.startswith(below))
        for path in paths:
            if listings:
                self._drop_listing(split_parent(path)[0])
            self._mark_stale(path)

    def invalidate(self, path: str) -> None:
        self._positive.pop(path)
        self._negative.pop(path)
        self._drop_listing(split_parent(path)[0])
        self._mark_stale(path)
        self._flood.invalidate(path)

    async def confirm_replica(self, path: str) -> bool:
        """At an open of this node's replica of `path`: when this node is the home of its directory,
        its own record of the source answers (a write through any mount announces the file to the
        home before its close(2) returns, so the record is as exact as asking the source); else the
        source itself."""
        reply = await self._peers.ask(self._peers.me, msg.Locate(path))
        if reply is None or reply.replica is None:
            return True
        if await self._home_here_vouches(path, reply.replica):
            return True
        return await self._flood.replica_still_valid(path, reply.replica, exact=True)

    async def _home_here_vouches(self, path: str, replica: ReplicaSource) -> bool:
        """This node is the home of `path`'s directory and records the replica's source unchanged."""
        directory, name = split_parent(path)
        if self.index is None or self._homes.peek(directory) != self._peers.me or directory in self._parts:
            return False
        if self._peers.is_down(replica.node):
            return False  # its changes may not have reached this home
        try:
            answer = await self._peers.ask(self._peers.me, msg.IndexLookup(directory, name, None))
        except OSError:
            return False
        return answer.complete and not answer.pending and any(
            holder.node == replica.node and holder.replica_of is None
            and (holder.attr.size, holder.attr.mtime_ns) == (replica.size, replica.mtime_ns)
            for holder in answer.holders)

    def forget_absent(self, path: str, is_dir: bool = False) -> None:
        """A home (or a node without one) says `path` exists now: drop "not found" for it and its parents."""
        self._positive.pop(path)
        self._drop_listing(split_parent(path)[0])
        drop_absent(self._negative, self._flights, path, is_dir)

    def forget_all(self) -> None:
        """A node (re)started: every cache goes, homes included (a restarted home re-reads its
        records from its backup; asking again costs one round trip per directory)."""
        self._revoked += 1
        self._positive.clear()
        self._negative.clear()
        self._homes.clear()
        self._listings.clear()
        self._streaks.clear()
        self._unlisted.clear()
        self._parts.clear()
        self._flood.forget_all()

    def _remember_negative(self, path: str, until: float) -> None:
        self._negative.put(path, None, until, trio.current_time())
