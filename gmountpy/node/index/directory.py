"""A directory's home: its index, built from the exports, and the `index_*` operations it serves.

Every directory has a home node (see `homes`). The home keeps the exact index of that
directory -- name -> holders, each with its attributes -- and answers in one round trip:
who holds this name (`index_lookup`), the whole directory (`index_list`), may this node
create it (`index_claim`), and here is a change (`index_set`, `index_drop`,
`index_replace`, `index_rename` -- a drop and a replace in one message --,
`index_forget`). Each is asked with its typed request in gmountpy.protocol.messages, and
each `op_*` method takes that request (decoded by the service before it runs).

A definite "not found" is a lease: the home remembers who was told, and before a claim
or a new name returns it tells those nodes (`created`, which also drops the kernel's
negative entries): hand-off rule 1 with one round trip per create. Listings are leased
the same way (about a second); any change in the directory revokes them, except to the
node that made the change, which applies it to its copy itself.

The index is soft state: built on first demand by asking every node once for its
listing (a directory just made by a mkdir through the mount is seeded empty instead),
and again when older than `rescan` seconds. Changes that arrive while a directory is
being built are replayed over the listings; claims not yet visible on disk survive a
rebuild.

A home that does not answer is replaced by its backup (`index_backup`): the backup lists
the directory from the exports (the dead home's own files are out of everyone's reach, but
the names of a directory it owned were copied here in batches: `owners`), answers without
leases, and tells every node of each new name (it cannot know whom the dead home had told
"not found"). The asking side is `locator.IndexLocator`.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from ..._trio import open_nursery
from ...errors import PeerUnavailable
from ...protocol import messages as msg
from ...protocol.attr import Attr
from ...protocol.messages import (
    DirEntry,
    IndexClaimReply,
    IndexHolder,
    IndexListReply,
    IndexLookupReply,
    IndexRow,
    SyncEntry,
)
from ..leases import WHOLE
from .entries import BuiltDirectory, Change, Entries, Holder, apply_change, same_but_atime
from .owners import OwnedDirectories
from .partitions import Misdirected
from .paths import join
from .peers import PAGE
from .store import AS_BACKUP

log = logging.getLogger(__name__)

#: Holders a home asks at once for the attributes of names claimed or renamed, to list a directory.
_RESOLVE_AT_ONCE = 64
#: Operations a backup serves for a home that does not answer.
BACKED_OPS = (
    msg.IndexLookup, msg.IndexClaim, msg.IndexSet, msg.IndexDrop, msg.IndexReplace, msg.IndexRename, msg.IndexList)
#: Operations on one directory that wait while a partition of it splits on this node.
GATED_OPS = (*BACKED_OPS, msg.IndexSync, msg.IndexAdopt)
#: Operations sent to a partition's server (`index_part`).
PART_OPS = (*BACKED_OPS, msg.IndexSync)


@dataclass(frozen=True)
class IndexStatistics:
    directories: int
    builds: int
    lookups: int
    negatives_leased: int
    revocations: int
    listings: int = 0
    taken_over: int = 0  # requests served as the backup of a home that did not answer
    splits: int = 0             # partitions this node split in two (Giga+)
    partitions: int = 0         # partitions of split directories this node serves
    partition_entries: int = 0  # names held in them
    redirects: int = 0          # requests for a name in a partition this node does not serve
    leases: int = 0             # leases held now ("not found", subdirectory homes, listings)
    evictions: int = 0          # directory indexes let go after `keep_idle` seconds unused
    owned: int = 0              # directories this node owns now (its jobs create there telling nobody)
    ownerships: int = 0         # times this node began owning a directory
    releases: int = 0           # ownerships ended by another node's request (the export listed into the index)
    names_copied: int = 0       # names of owned directories sent to their backups in batches
    names_kept: int = 0         # names kept here as the backup of directories other nodes own(ed)


class DirectoryIndex(OwnedDirectories):
    """The index a home keeps for the directories it is home of, served as `index_*` operations
    (`operations()`, for NodeService's `extra` table). The constructor's parameters: `IndexStore`."""

    def operations(self) -> msg.Operations:
        """The RPC operations, for NodeService's `extra` table (made once: `op_part` and `op_backup`
        serve the requests they carry with it)."""
        if self._operations is not None:
            return self._operations
        ops = msg.operations(
            self.op_lookup, self.op_claim, self.op_set, self.op_drop, self.op_replace, self.op_rename,
            self.op_forget, self.op_sync, self.op_list, self.op_backup, self.op_records, self.op_seed,
            self.op_adopt, self.op_part, self.op_split, self.op_parts, self.op_owned)
        for kind in GATED_OPS:
            ops[kind] = self._gated(ops[kind])
        self._operations = ops
        return ops

    def statistics(self) -> IndexStatistics:
        partitions = entries = 0
        for directory, parts in self._parts.items():
            partitions += len(self._served_here(directory, parts))
            built = self._dirs.get(directory)
            entries += len(built.entries) if built is not None else 0
        return IndexStatistics(len(self._dirs), self._builds, self._lookups, self._leased, self._revocations,
                               self._listings, self._taken_over, self._splits, partitions, entries,
                               self._redirects, self._leases_held(), self._evictions, len(self._owned),
                               self._ownerships, self._releases, self._copied,
                               sum(len(names) for _, names in self._owned_copies.values()))

    # -- building ------------------------------------------------------------

    async def _directory(self, directory: str) -> BuiltDirectory:
        while True:
            now = trio.current_time()
            current = self._dirs.get(directory)
            if directory in self._backing:
                fresh = self.backup_refresh > 0 and now - (current.built_at if current else now) < self.backup_refresh
            else:
                fresh = self.rescan <= 0 or now - (current.built_at if current else now) < self.rescan
            if current is not None and self._complete(directory, current) and fresh:
                current.used = now
                return current
            event = self._built.get(directory)
            if event is None:
                built = await self._build(directory)
            else:
                await event.wait()
                waited = self._dirs.get(directory)
                if waited is None:
                    continue
                built = waited  # as built just now, even with nodes missing: do not list again at once
            built.used = trio.current_time()
            await self._admit(directory, built.holders)  # listed again: held elsewhere too (copied in)?
            return built

    async def _build(self, directory: str) -> BuiltDirectory:
        self._builds += 1
        self._built[directory] = done = trio.Event()
        changes: list[Change] = []
        self._building[directory] = changes
        try:
            listings: dict[str, list[DirEntry]] = {}
            missing: list[str] = []

            async def fetch(node: str) -> None:
                try:
                    entries = await self._list(node, directory)
                except PeerUnavailable:
                    missing.append(node)
                    return
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                        return
                    log.warning("listing %s on %s for its index failed: %s", directory, node, exc)
                    missing.append(node)
                    return
                if entries is not None:
                    listings[node] = entries

            started = trio.current_time()
            async with open_nursery() as nursery:
                for node in self.order:
                    if self._peers.is_down(node):
                        missing.append(node)
                    else:
                        nursery.start_soon(fetch, node)
            entries: Entries = {}
            for node, listing in listings.items():
                for entry in listing:
                    entries.setdefault(entry.name, {})[node] = Holder(entry.attr.is_dir, entry.attr, entry.replica_of)
            if self._backing.get(directory) in missing:
                self._held_by_dead_home(directory, entries)  # what it owned, as it copied it here
            old = self._dirs.get(directory)
            if old is not None:  # claims whose files are not on disk yet survive the rebuild
                for name, holders in old.entries.items():
                    for node, holder in holders.items():
                        if holder.attr is None and node not in entries.get(name, {}):
                            entries.setdefault(name, {})[node] = holder
            for change in changes:  # what happened while the listings were taken, in order
                apply_change(entries, change)
            if directory in self._parts:  # split: only the names of the partitions served here
                entries = {name: holders for name, holders in entries.items() if self._mine(directory, name)}
            built = BuiltDirectory(entries, started, tuple(sorted(missing)), bool(listings), set(listings))
            await self._settle_homes(directory, entries)
            for name in [name for name in self._negatives.names(directory) if entries.get(name)]:
                # told "not found" before this listing (by an index since forgotten): no more
                await self._revoke(directory, name, any(h.is_dir for h in entries[name].values()), but=None)
            if directory in self._outdated:
                self._outdated.discard(directory)
                return built  # good enough for this caller (it asked before the change); not kept
            self._dirs[directory] = built
            self._split_check.pop(directory, None)
            return built
        finally:
            del self._building[directory]
            del self._built[directory]
            done.set()

    # -- answers ---------------------------------------------------------------

    async def _resolved(self, directory: str, name: str) -> tuple[list[IndexHolder], bool, bool]:
        """(every holder, complete, pending) for one name.

        Claimed entries get their attributes from their holder here (one message from the
        home, once): a holder without the file yet is "pending" if the claim is recent.
        """
        built = await self._directory(directory)
        holders = dict(built.entries.get(name, {}))
        pending = False
        path = join(directory, name)
        for node, holder in list(holders.items()):
            if holder.attr is not None:
                continue
            del holders[node]
            try:
                attr = await self._peers.ask(node, msg.Lookup(path), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("holder %s of %s could not be asked for its attributes: %s", node, path, exc)
                pending = True  # it may well have it: neither "here" nor "not here"
                continue
            current = self._dirs.get(directory)
            if attr is None:
                if holder.recent(trio.current_time()):
                    pending = True  # being created right now: neither "here" nor "not here" yet
                elif current is not None and current.entries.get(name, {}).get(node) is holder:
                    apply_change(current.entries, (name, node, None))  # a create that never happened
                continue
            holders[node] = resolved = Holder(attr.is_dir, attr, holder.replica_of, holder.since)
            if current is not None and current.entries.get(name, {}).get(node) is holder:
                current.entries[name][node] = resolved
        current = self._dirs.get(directory)
        complete = current is not None and self._complete(directory, current)
        found = [IndexHolder(node, holder.attr, holder.replica_of) for node, holder in holders.items()
                 if holder.attr is not None]
        return found, complete, pending

    async def op_lookup(self, request: msg.IndexLookup) -> IndexLookupReply:
        """Every holder of `name` in `directory`. A definite "none" to `asker` is leased to it:
        the reply's `lease` is how long this home will revoke it (tell `asker` of a create).
        A subdirectory comes with its `home`, leased for `home_lease` seconds (revoked when the
        subdirectory goes). `with_listing`: the whole directory comes too, as `index_list` gives
        it (not for a split directory, whose other partitions are elsewhere)."""
        directory, name, asker = request.directory, request.name, request.asker
        self._lookups += 1
        backing = self._serving_as_backup(directory)
        holders, complete, pending = await self._resolved(directory, name)
        if not holders and complete and not pending and self.verify_misses:
            holders = await self._verify_absent(directory, name, asker)
        lease = 0.0
        owned = await self.owned_now(directory)  # (this node's own request: another's ended it)
        if (not holders and complete and not pending and asker is not None and self.lease > 0 and not backing
                and not owned):  # an owned directory's index lags behind its export: misses are not leased
            self._negatives.grant(directory, name, asker, trio.current_time() + self.lease)
            self._leased += 1
            lease = self.lease
        home, home_lease = None, 0.0
        if any(holder.attr.is_dir for holder in holders):
            home = self._child_home(directory, name, [holder.node for holder in holders])
            home_lease = self._lease_home(directory, name, asker) if home is not None else 0.0
        current = self._dirs.get(directory)
        parts = self._bitmap(directory)
        listing = (await self.op_list(msg.IndexList(directory, asker))
                   if request.with_listing and not parts else None)
        return IndexLookupReply(tuple(holders), complete, pending, lease, home, home_lease,
                                None if parts is None else tuple(parts),
                                None if current is None else len(current.entries), listing)

    async def op_list(self, request: msg.IndexList) -> IndexListReply:
        """The whole directory in one reply: each name with its holders, and its home for a
        subdirectory. Complete: leased to `asker` for `listing_lease` seconds (any change revokes it)."""
        directory, asker = request.directory, request.asker
        self._listings += 1
        backing = self._serving_as_backup(directory)
        owned = await self.owned_now(directory)
        if owned:
            await self._list_own_export(directory)  # what this node's jobs made there, not told to the index
        built = await self._directory(directory)
        asked: dict[str, list[IndexHolder]] = {}  # claimed or renamed names: their holders are asked, at once
        limiter = trio.CapacityLimiter(_RESOLVE_AT_ONCE)

        async def resolve(name: str) -> None:
            async with limiter:
                asked[name] = (await self._resolved(directory, name))[0]

        async with open_nursery() as nursery:
            for name, holders in list(built.entries.items()):
                if any(holder.attr is None for holder in holders.values()):
                    nursery.start_soon(resolve, name)
        rows: list[IndexRow] = []
        for name, holders in list(built.entries.items()):
            found = asked.get(name)
            if found is None:
                found = [IndexHolder(node, holder.attr, holder.replica_of) for node, holder in holders.items()
                         if holder.attr is not None]  # (claimed since: not listed yet)
            if not found:
                continue
            home = None
            if any(holder.attr.is_dir for holder in found):
                home = self._child_home(directory, name, [holder.node for holder in found])
                if home is not None:
                    self._lease_home(directory, name, asker)
            rows.append(IndexRow(name, tuple(found), home))
        current = self._dirs.get(directory, built)
        complete = self._complete(directory, current)
        if len(rows) > PAGE:
            raise OSError(errno.EFBIG, f"{directory} has {len(rows)} entries: list it from every node in pages")
        lease = 0.0
        if complete and asker is not None and self.listing_lease > 0 and not backing and not owned:
            self._listing_leases.grant(directory, WHOLE, asker, trio.current_time() + self.listing_lease)
            lease = self.listing_lease
        parts = self._bitmap(directory)
        return IndexListReply(tuple(rows), complete, current.exists or bool(rows), lease,
                              self.home_lease if asker is not None else 0.0, None if parts is None else tuple(parts))

    # -- requests served for another node ----------------------------------------

    async def op_backup(self, request: msg.IndexBackup[Any]) -> Any:
        """Serve the carried request for `home`, which did not answer the asker: this node stands in
        for it (the backup, at the same site). The directory is listed from the exports again (soft
        state), every create is told to every node (the leases `home` handed out died with it), and
        no "not found" or listing is leased."""
        carried, home = request.request, request.home
        if not isinstance(carried, BACKED_OPS):
            raise OSError(errno.EINVAL, f"node {self._peers.me} does not serve {carried.op!r} as a backup")
        if carried.directory in self._parts:
            raise OSError(errno.EHOSTDOWN, f"node {self._peers.me} serves partitions of the split directory "
                                           f"{carried.directory}: it cannot stand in for its home {home}")
        self._taken_over += 1
        token = AS_BACKUP.set(home)
        try:
            return await self.operations()[type(carried)](carried)
        finally:
            AS_BACKUP.reset(token)

    async def op_part(self, request: msg.IndexPart[Any]) -> msg.PartOk[Any] | msg.PartRedirect:
        """The carried request for a split directory, from an asker that maps its name to
        `partition` of this node with the partitions `bitmap` (and the directory's `home`).
        Answers PartOk with its reply, or, for a name another node serves, PartRedirect with the
        partitions known here: the asker merges them and asks again (Giga+'s correction of a
        stale mapping, a hop per stale level)."""
        carried = request.request
        if not isinstance(carried, PART_OPS):
            raise OSError(errno.EINVAL, f"node {self._peers.me} does not serve {carried.op!r} for a partition")
        directory = carried.directory
        await self._learn(directory, request.home, request.bitmap)
        try:
            result = await self.operations()[type(carried)](carried)
        except Misdirected as exc:
            return msg.PartRedirect(tuple(exc.bitmap))
        return msg.PartOk(result, tuple(self._bitmap(directory) or [0]))

    # -- changes -------------------------------------------------------------------

    async def op_claim(self, request: msg.IndexClaim) -> IndexClaimReply:
        """`node` is about to create `name`: the existing holders if there are any (nothing is
        claimed then), else none, and `seeded` and `keep` (IndexClaimReply) -- the name is
        recorded for `node` and every node holding a "not found" for it has been told before
        this returns.

        `exclusive` False (a parent directory a create makes on `node`): a directory merges
        with the directories of that name elsewhere, so it is always recorded.
        A new directory is homed at `node` (`Homes.of_creator`), recorded here and on this
        directory's backup (one intra-site message) before this returns -- or by `node` itself
        when it is that backup (`keep`: the copy needs no message), or, in a directory this
        node owns, with the next batch of copies (`flush_records`, within a second). When that
        home is this node or the backup, its index is started empty here or with the copy
        (`seeded`): the creator's mkdir saves the round trip of the seed.
        """
        directory, name, node, is_dir = request.directory, request.name, request.node, request.is_dir
        backing = self._serving_as_backup(directory)
        holders, _, pending = await self._resolved(directory, name)
        others = [holder for holder in holders if holder.node != node]
        if request.exclusive and not others and not pending and self.verify_misses:
            others = await self._verify_absent(directory, name, node)
        if request.exclusive and (others or pending):
            if not others:
                raise OSError(errno.EAGAIN, f"{join(directory, name)} is being created on another node; "
                                            "try again")
            return IndexClaimReply(tuple(others))  # (nothing is made on `node`: it is no holder of the directory)
        await self._admit(directory, [node])
        built = self._dirs.get(directory)
        if built is not None:
            built.holders.add(node)  # a create there makes the directory on `node` (if it lacked it)
        self._change(directory, (name, node, Holder(is_dir, None, None, trio.current_time())))
        seeded = keep = False
        if is_dir and self.homes is not None:
            records = self._child_homes.setdefault(directory, {})
            if not holders or name not in records:  # a new name: homed at its creator's site
                home = records[name] = self.homes.of_creator(join(directory, name), node)
                seed = node if not holders and not pending else None  # new everywhere: it starts empty
                if seed is not None and home == self._peers.me:
                    await self.op_seed(msg.IndexSeed(join(directory, name), seed))
                    seeded = True
                if self._backup_node(directory) == node:
                    keep = True  # the claimant copies it to itself
                    seeded = seeded or (seed is not None and home == node)
                elif directory in self._owned and home == self._peers.me:
                    self._copy_records_later(directory, {name: home})  # (the backup seeds nothing homed here)
                else:
                    reached = await self._copy_records(directory, {name: home}, seed=seed)
                    seeded = seeded or (seed is not None and reached == home)
            self._lease_home(directory, name, node)
        await self._revoke(directory, name, is_dir, but=node, everyone=backing)
        await self._changed(directory, [name], but=node)
        if node == self._peers.me and not self._foreign():
            await self._maybe_own_again(directory)
        return IndexClaimReply((), seeded, keep)

    async def _verify_absent(self, directory: str, name: str, asker: str | None) -> list[IndexHolder]:
        """Ask the nodes holding `directory` (but the asker, which looked in its own export) for
        `name`: what they hold is recorded (as a scan would) and returned."""
        built = self._dirs.get(directory)
        path = join(directory, name)
        found: list[IndexHolder] = []

        async def ask(node: str) -> None:
            try:
                attr = await self._peers.ask(node, msg.Lookup(path), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not ask %s whether it holds %s: %s", node, path, exc)
                return
            if attr is not None:
                self._change(directory, (name, node, Holder(attr.is_dir, attr)))
                found.append(IndexHolder(node, attr, None))

        async with open_nursery() as nursery:
            for node in sorted(built.holders if built is not None else ()):
                if node != asker and not self._peers.is_down(node):
                    nursery.start_soon(ask, node)
        return found

    async def op_set(self, request: msg.IndexSet) -> None:
        """`node` holds `name` with these attributes (None: ask it) -- after a write, a put, a staging.
        `asker` (default `node`), the node that made the change, keeps its listing (see `_changed`)."""
        directory, name, node, attr = request.directory, request.name, request.node, request.attr
        backing = self._serving_as_backup(directory)
        if backing:  # a stand-in tells every node of a name new to it (a put), not of a close
            built = await self._directory(directory)
            backing = not built.entries.get(name)
        holder = Holder(attr.is_dir if attr is not None else request.is_dir, attr, request.replica_of,
                        trio.current_time())
        await self._admit(directory, [node])
        self._change(directory, (name, node, holder))
        await self._revoke(directory, name, holder.is_dir, but=node, everyone=backing)
        await self._changed(directory, [name], but=node if request.asker is None else request.asker)
        if node == self._peers.me and not self._foreign():
            await self._maybe_own_again(directory)

    async def op_drop(self, request: msg.IndexDrop) -> list[str]:
        """`name` is gone from `nodes` (None: from every node). `asker`, the node that removed it,
        keeps its listing and forgets a removed directory's home itself (IndexLocator's
        announce_removed and announce_renamed): a revocation there would cost the removal a
        round trip. A removed directory's index is forgotten at its home and `index_home`, and
        `keep` has the asker, the backup, drop its copy of its record itself (see `_drop_home`);
        the homes that did not answer."""
        directory, name, asker, index_home = request.directory, request.name, request.asker, request.index_home
        self._serving_as_backup(directory)
        unreached: list[str] = []
        self._removed.record(directory, name, trio.current_time())
        if request.nodes is None:
            self._change(directory, (name, None, None))
            unreached += await self._drop_home(directory, name, forgotten_by=asker, index_home=index_home,
                                               kept=request.keep)
            index_home = None
        else:
            for node in request.nodes:
                self._change(directory, (name, node, None))
        return unreached + await self._changed(directory, [name], but=asker, forgotten_by=asker,
                                               index_home=index_home, kept=request.keep)

    async def op_replace(self, request: msg.IndexReplace) -> None:
        """After a rename to `name`: exactly `nodes` hold it now (their attributes are asked later).
        A directory renamed here is homed by `Homes.of_holders` (its old home's records are gone
        with its old path). `asker`, the renaming node, is not told "created": its kernel moved
        the entry itself, and it holds that directory's lock until this returns (an
        invalidation there would wait for KERNEL_NOTIFY_WAIT: 0.5 s per rename)."""
        directory, name, nodes, is_dir, asker = (request.directory, request.name, request.nodes, request.is_dir,
                                                 request.asker)
        backing = self._serving_as_backup(directory)
        await self._admit(directory, nodes)
        current = self._dirs.get(directory)
        if current is None or current.entries.get(name):  # an old file under `name` is gone
            self._removed.record(directory, name, trio.current_time())
        self._change(directory, (name, None, None))
        await self._drop_home(directory, name)
        now = trio.current_time()
        for node in nodes:
            self._change(directory, (name, node, Holder(is_dir, None, None, now, renamed=True)))
        if is_dir and self.homes is not None:
            home = self._child_home(directory, name, nodes)
            await self._copy_records(directory, {name: home})
        await self._revoke(directory, name, is_dir, but=asker, everyone=backing)
        await self._changed(directory, [name], but=asker)

    async def op_rename(self, request: msg.IndexRename) -> None:
        """A rename within `directory`: op_drop of `src`, then op_replace of `name`, in one message.
        EXDEV when this node does not serve `src` too (the two names are in partitions of a split
        directory that different nodes serve): the asker sends the two messages instead."""
        directory, name, src = request.directory, request.name, request.src
        if not self._mine(directory, src):
            raise OSError(errno.EXDEV, f"node {self._peers.me} does not serve both {src!r} and {name!r} of the "
                                       f"split directory {directory}")
        await self.op_drop(msg.IndexDrop(directory, src, None, request.asker))
        await self.op_replace(msg.IndexReplace(directory, name, request.nodes, request.is_dir, request.asker))

    async def op_sync(self, request: msg.IndexSync) -> None:
        """`node`'s export changed outside the mount (or its scan saw the mount's own changes):
        these entries of `directory` are new or changed there, and those with no attributes
        are gone from it.

        Names new to the directory revoke the "not found" handed out for them, like a create.
        A split directory's changes go on to the servers of the partitions this node knows of
        and the sender did not (`covered`); each keeps the names of its own partitions.
        """
        await self._sync(request)

    async def _sync(self, request: msg.IndexSync, *, fresh: bool = False) -> None:
        """`op_sync`. `fresh`: the listing is newer than whatever a claim or close told this home
        (this node's own export, listed at the end of an ownership: its closes told nobody)."""
        directory, node, changes = request.directory, request.node, request.changes
        await self._admit(directory, [node])
        parts = self._parts.get(directory)
        if parts is not None:
            await self._pass_on(directory, parts, msg.IndexSync(directory, node, changes, sorted(parts.bitmap)),
                                request.covered)
            changes = [entry for entry in changes if self._mine(directory, entry.name)]
        if self._dirs.get(directory) is None and directory not in self._building:
            if node == self._peers.me and directory in self._names_copied:
                self._names_later[directory] = None  # (let go while idle: the next batch lists the export)
            return  # not built: the next build lists it anyway
        seen: dict[str, Holder] = {}
        gone: list[str] = []
        for entry in changes:
            if entry.attr is None:
                gone.append(entry.name)
                continue
            seen[entry.name] = Holder(entry.attr.is_dir, entry.attr, entry.replica_of)
        seen, unchecked = await self._checked_against_removals(directory, node, seen)
        current = self._dirs.get(directory)
        if current is None and directory not in self._building:
            return
        # Under a build, the changes are logged for it (`_change`) and applied after its listings,
        # as a claim's are: a directory that changes every second while it takes longer than that
        # to list would never be kept if its build were thrown away instead.
        entries = current.entries if current is not None else {}
        now = trio.current_time()
        new_names = [name for name in seen if not entries.get(name)]
        # a subdirectory that appeared on `node` outside the mount: its home (seeded empty by a
        # mkdir, or built before) has not listed it there -- it lists it again when next asked
        appeared = [name for name, holder in seen.items()
                    if holder.is_dir and node not in entries.get(name, {})
                    and name in self._child_homes.get(directory, {})]
        changed: list[str] = list(new_names)
        # The scan's listing was taken before it was sent: what a claim or a close told this home
        # within CLAIM_GRACE may be newer than it, and is kept -- a name created meanwhile is not
        # removed (it would vanish from listings until the next scan), nor its size made older.
        for name in gone:
            holder = entries.get(name, {}).get(node)
            if (current is None or holder is not None) and (holder is None or not holder.recent(now)):
                self._change(directory, (name, node, None))  # (first build: its listing may have it)
                changed.append(name)
        for name, holder in seen.items():
            before = entries.get(name, {}).get(node)
            if before is not None and before.recent(now):
                if before.attr is not None and not fresh:
                    continue
                # A claim's or a rename's attributes, first known now. After a rename they may be
                # those of an old file it replaced that this home never knew of (copied in outside
                # the mount, listed before the rename): not kept over the next scan, which lists
                # what the rename put there -- unless the holder was asked just now (`since`).
                since = before.since if not before.renamed or holder.since is not None else None
                holder = Holder(holder.is_dir, holder.attr, holder.replica_of, since)
            # a rename's attributes, not known here till now: every listing handed out since asked the holder
            filled = before is not None and before.renamed and before.attr is None
            if name not in new_names and not filled and not same_but_atime(before, holder):
                changed.append(name)
            self._change(directory, (name, node, holder))
        for name in new_names:
            await self._revoke(directory, name, seen[name].is_dir, but=None)
        if changed:  # a scan that found nothing new (the mount's own creates, told already) revokes nothing
            await self._changed(directory, changed, but=None)
        for name in appeared:
            child, home = join(directory, name), self._child_homes[directory][name]
            try:
                await self._peers.ask(home, msg.IndexAdopt(child, node), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not tell %s, the home of %s, that it appeared on %s: %s", home, child, node, exc)
        if unchecked:
            raise OSError(errno.EAGAIN, f"node {self._peers.me} could not ask {node} whether it still holds "
                                        f"{', '.join(sorted(unchecked))} in {directory} (removed or renamed over "
                                        "through a mount just now); its next scan tells them again")

    async def _checked_against_removals(self, directory: str, node: str,
                                        seen: dict[str, Holder]) -> tuple[dict[str, Holder], list[str]]:
        """`seen`, a scan of `node`'s export, without what may predate a removal recorded here.

        The scan listed the directory before it was sent; an unlink or a rename through a mount
        may have removed a name it lists (or renamed another file over it) and been recorded
        here meanwhile: taken as it is, the scan would bring the old file back. So the names
        removed through a mount within CLAIM_GRACE are asked of `node` now -- after that
        removal -- and kept, with the attributes it answers, only if it holds them still (a file
        put there again outside the mount, a rename's new file) and no removal of them was
        recorded while it was asked. Costs one lookup per such name, only for names removed
        lately (a rename to a new name removes nothing). Also the names this node could not
        ask (they are left out; the sender is told, and tells them again at its next scan).
        """
        now = trio.current_time()
        current = self._dirs.get(directory)
        suspects: list[str] = []
        for name in seen:
            if self._removed.number(directory, name, now) is None:
                continue
            before = current.entries.get(name, {}).get(node) if current is not None else None
            if before is not None and before.attr is not None and before.recent(now):
                continue  # a claim's or a close's attributes: kept over any scan anyway
            suspects.append(name)
        if not suspects:
            return seen, []
        asked_after = self._removed.count
        found: dict[str, Attr | None] = {}
        unchecked: list[str] = []
        limiter = trio.CapacityLimiter(_RESOLVE_AT_ONCE)

        async def ask(name: str) -> None:
            async with limiter:
                try:
                    found[name] = await self._peers.ask(node, msg.Lookup(join(directory, name)),
                                                        timeout=self.ask_timeout)
                except OSError as exc:
                    log.info("could not ask %s whether it still holds %s: %s", node, join(directory, name), exc)
                    unchecked.append(name)

        async with open_nursery() as nursery:
            for name in suspects:
                nursery.start_soon(ask, name)
        checked = dict(seen)
        now = trio.current_time()
        for name in suspects:
            attr = found.get(name)
            again = self._removed.number(directory, name, now)
            if attr is None or (again is not None and again > asked_after):
                del checked[name]  # gone, or removed again while asked (the answer may predate it)
            else:  # as new as a close's: no scan listed before it takes it over
                checked[name] = Holder(attr.is_dir, attr, seen[name].replica_of, now)
        return checked, unchecked

    async def op_adopt(self, request: msg.IndexAdopt) -> None:
        """`directory` appeared on `node` outside the mount (its parent's home saw it in a sync):
        list it there now -- which also has `node` watch it -- and revoke the "not found"
        handed out for what it holds."""
        directory, node = request.directory, request.node
        if directory not in self._dirs:
            await self._directory(directory)  # a build lists every node, `node` included
            return
        try:
            listing = await self._list(node, directory)
        except OSError as exc:
            log.info("could not list %s on %s: %s", directory, node, exc)
            self.forget([directory])
            return
        await self.op_sync(msg.IndexSync(directory, node, [SyncEntry(*entry) for entry in listing or []]))

    async def _changed(self, directory: str, names: Sequence[str], *, but: str | None,
                       forgotten_by: str | None = None, index_home: str | None = None,
                       kept: bool = False) -> list[str]:
        """After a change in `directory`: subdirectories that are gone lose their homes and
        indexes, and every listing of the directory handed out is revoked but `but`'s, the node
        that made the change, which keeps its lease (`forgotten_by`, `index_home`, `kept`: see
        `_drop_home`). The homes that did not answer."""
        current = self._dirs.get(directory)
        unreached: list[str] = []
        for name in names:
            if name not in self._child_homes.get(directory, {}) and index_home is None:
                continue
            if current is None and directory not in self._building and directory not in self._backing:
                current = await self._directory(directory)  # let go while idle: is `name` still a directory?
            gone = current is not None and not any(h.is_dir for h in current.entries.get(name, {}).values())
            if gone:
                unreached += await self._drop_home(directory, name, forgotten_by=forgotten_by, index_home=index_home,
                                                   kept=kept)
        leases = self._listing_leases.revoke(directory, WHOLE)
        if leases:
            kept_lease = leases.get(but) if but is not None else None
            if but is not None and kept_lease is not None and kept_lease > trio.current_time():
                # the node that made the change applies it to its listing itself (IndexLocator.change)
                self._listing_leases.grant(directory, WHOLE, str(but), kept_lease)
            await self._tell(leases, msg.IndexUnlist(directory), but=but)
        return unreached
