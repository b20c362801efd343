"""Directories a home owns: made through its mount and touched by no other node.

A directory made through node N's mount is homed at N (`Homes.of_creator`). While no other
node holds a lease in it -- no "not found" of one of its names, no listing of it -- and
every name in it is N's own, nothing N does there needs telling anyone: N **owns** it.
The jobs of N then create files there straight in N's export, with no message at all
(the preload library, csrc/gmount_preload.c), and N's own creates, closes, stats and
listings there cost no message to another node either. The index N keeps of the
directory may lag behind its export meanwhile; the export is the truth.

The first request about the directory from any other node -- a lookup, a claim, a
listing, a change, a scan report, a forget -- ends the ownership before it is served
(`_end_ownership`): N takes the mark off the directory, waits for every create a job has
under way there, and lists its export into the index (`op_sync`, as a scan would). So no
node is ever told "not found" for a name whose create returned (hand-off rule 1) and no
claim elsewhere misses a name made here (no twins, rule 3). A name of another node entering
the index by any path (a scan report N relays as the parent's home, a listing again) ends it
too (`_admit`): N's own lookups there answer from its export alone. N owns the directory again
once the leases the others were given have ended (a create through the mount there
checks, at most once a second).

The mark is an extended attribute of the directory in the export, `OWNER_XATTR`:
`TOKEN PATH`, this daemon's token (random, handed to jobs with the bypass's hello) and
the directory's path in the namespace. A job creates in the directory only while it
holds a shared `flock` of the directory and sees the mark with its own path and the
daemon's token; N ends an ownership by taking the mark off and then an exclusive
`flock`, which waits for the creates under way. A directory renamed (or a daemon
restarted: a new token) no longer shows a valid mark. See docs/directory-index.md.

Nobody else holds the names an owned directory's jobs make there, so a dead owner would take
them out of everyone's sight, and a node creating one of them meanwhile would make a second
file of that name (Giga+, TableFS and COFS keep such a home's records at its backup). So N
copies the names it holds there to the directory's backup in batches (`flush_names`, every
second, off the create path: the export's scan brings the jobs' creates into the index, and
what changed since the last batch is sent), from the first ownership until the directory goes
or a node restarts -- and the directory's own name, to its parent's backup, when N is the
parent's home too (a top-level directory whose parent, the root, is homed at N). A backup
standing in for a dead N answers with those names as N's (`_held_by_dead_home`): stat shows
them, an open or a create of one fails with EIO (N holds it, and is down) or EEXIST instead
of making a twin. A name made in the last batch window (about two
seconds: a scan, then a batch) is not there yet: that is the loss window of docs/failures.md.

`marks.Owners` is the export's side (marks and locks); `OwnedDirectories` the home's.
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Iterable

import trio

from ...errors import PeerUnavailable
from ...protocol import messages as msg
from ...protocol.messages.index import SyncEntry
from ..leases import WHOLE
from ..service import REQUEST_FROM
from .entries import Entries, Holder
from .paths import split_parent, under_any
from .peers import PAGE, list_whole
from .records import SubdirectoryHomes

log = logging.getLogger(__name__)

#: How often (seconds) a home checks whether it may own a directory again, per directory.
RECHECK = 1.0


class OwnedDirectories(SubdirectoryHomes):
    """The home's index, with the directories this node owns (see the module)."""

    def owns(self, directory: str) -> bool:
        """Whether this node's jobs may create in `directory` without telling anyone now (as this
        node recorded it; `owned_now` checks the mark is still there)."""
        return directory in self._owned

    async def owned_now(self, directory: str) -> bool:
        """`owns`, and the mark still on the directory; a mark gone from under this node (the
        directory removed or renamed outside the mount) ends the ownership."""
        if directory not in self._owned:
            return False
        assert self.owners is not None
        if self.owners.marked(directory):
            return True
        await self._end_ownership(directory)
        return False

    def _foreign(self) -> bool:
        """Whether the request being served comes from another node (or a client)."""
        return REQUEST_FROM.get() != self._peers.me

    async def take_ownership(self, directory: str, new: bool = False) -> bool:
        """Own `directory` if nobody else holds a lease in it (see `_may_own`): this node made it
        just now (`new`: its backup holds no copy of names in it from this node), or creates in it
        through its mount. True when owned now."""
        if directory in self._owned:
            return True
        if self.owners is None or not self._may_own(directory):
            return False
        if not self.owners.mark(directory):
            return False
        self._owned.add(directory)
        self._ownerships += 1
        if directory not in self._names_copied:  # its backup gets its names from the next batch on
            if new:
                self._names_unsent.add(directory)
            self._copy_names(directory, self._dirs[directory].entries)  # (built and whole: `_may_own`)
        parent, name = split_parent(directory)
        if parent in self._dirs and parent not in self._backing and parent not in self._parts:
            self._copy_names(parent, [name])  # homed here too: the directory itself is a name of this node's
        return True

    def _copy_names(self, directory: str, names: Iterable[str]) -> None:
        """Copy `names` of `directory` to its backup with the next batch, and its changes from then on."""
        self._names_copied.add(directory)
        later = self._names_later.setdefault(directory, set())
        if later is not None:
            later.update(names)

    async def _maybe_own_again(self, directory: str) -> None:
        """After a change this node made in `directory` through its mount: own it again if it may
        (checked at most every RECHECK seconds per directory)."""
        if self.owners is None or directory in self._owned:
            return
        now = trio.current_time()
        if now - self._own_checked.get(directory, -math.inf) < RECHECK:
            return
        self._own_checked[directory] = now
        if len(self._own_checked) > 4 * len(self._dirs) + 1024:
            self._own_checked = {d: t for d, t in self._own_checked.items() if now - t < RECHECK}
        await self.take_ownership(directory)

    def _may_own(self, directory: str) -> bool:
        """Owning is safe: this node is the directory's home, its index is whole and built here
        (not split, not stood in for), every name in it is this node's own (no replica, nothing
        held elsewhere), and no node holds a "not found" in it or its listing: no answer anyone
        keeps can be made untrue by a create here that nobody hears of."""
        if directory == "/" or directory in self._backing or directory in self._parts:
            return False
        if directory in self._building or directory in self._closed or directory in self._draining:
            return False
        if self.homes is not None and self.homes.central is not None and self.homes.central != self._peers.me:
            return False
        built = self._dirs.get(directory)
        if built is None or built.missing or not built.exists:
            return False
        now = trio.current_time()
        if any(until > now for name in self._negatives.names(directory)
               for until in self._negatives.holders(directory, name).values()):
            return False
        if any(until > now for until in self._listing_leases.holders(directory, WHOLE).values()):
            return False
        me = self._peers.me
        return all(set(holders) == {me} and all(h.replica_of is None for h in holders.values())
                   for holders in built.entries.values())

    async def _ownership_gate(self, directory: str) -> None:
        """Before a request about `directory` is served: another node's ends the ownership (the
        export's creates reach the index first); this node's own is served as it is."""
        if (directory in self._owned or directory in self._unsettled) and self._foreign():
            await self._end_ownership(directory)
        elif (waiting := self._draining.get(directory)) is not None:
            await waiting.wait()

    async def _admit(self, directory: str, nodes: Iterable[str]) -> None:
        """Names held by `nodes` are about to enter `directory`'s index (a claim, a scan report, an
        adoption, a rename's target): when one of them is another node, this node no longer holds
        every name there and its ownership ends first -- whoever sent the request (the gate ends it
        only for another node's: a scan report this node relays from another's export is its own)."""
        if directory in self._owned or directory in self._unsettled:
            me = self._peers.me
            if any(node != me for node in nodes):
                await self._end_ownership(directory)

    async def _end_ownership(self, directory: str) -> None:
        """Take the mark off, wait for the creates under way, and list the export into the index.
        A job stuck in a create keeps the directory unsettled: EIO until it lets go."""
        waiting = self._draining.get(directory)
        if waiting is not None:
            await waiting.wait()
            if directory not in self._unsettled:
                return
        if directory not in self._owned and directory not in self._unsettled:
            return
        self._owned.discard(directory)
        self._unsettled.add(directory)
        done = self._draining[directory] = trio.Event()
        try:
            assert self.owners is not None
            await self.owners.unmark(directory)
            await self._list_own_export(directory)
            self._unsettled.discard(directory)
            self._releases += 1
            self._own_checked[directory] = trio.current_time()
        finally:
            del self._draining[directory]
            done.set()

    async def _list_own_export(self, directory: str) -> None:
        """This node's listing of `directory` into the index: new names, sizes and removals made
        here that the index did not hear of (as a scan report of this node's export would)."""
        built = self._dirs.get(directory)
        if built is None and directory not in self._building:
            return  # not built: its next build lists every export
        me = self._peers.me
        try:
            listing = await list_whole(self._peers, me, directory) or []
        except PeerUnavailable:
            raise
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
            listing = []
        names = {entry.name for entry in listing}
        entries = built.entries if built is not None else {}
        gone = [name for name, holders in entries.items() if me in holders and name not in names]
        await self._sync(msg.IndexSync(directory, me, [SyncEntry(*entry) for entry in listing]
                                       + [SyncEntry(name, None) for name in gone]), fresh=True)

    async def _sync(self, request: msg.IndexSync, *, fresh: bool = False) -> None:
        """A scan report of `node`'s export (directory.DirectoryIndex serves it); `fresh`: newer
        than what closes told the home."""
        raise NotImplementedError

    async def _forgotten(self, prefixes: list[str]) -> None:
        """Directories under `prefixes` are forgotten (op_forget): another node's request ends their
        ownership first (the index built again must not miss a create under way); this node's
        own keeps the ones still marked (a change that failed half-way here)."""
        under = under_any(prefixes)
        for directory in [d for d in (*self._owned, *self._unsettled) if under(d)]:
            if self._foreign() or directory in self._unsettled:
                await self._end_ownership(directory)
            else:
                await self.owned_now(directory)

    def moved(self, prefixes: list[str]) -> None:
        """Directories under `prefixes` were renamed or removed (index_unhome): no longer owned, and
        the mark of a renamed one goes (it names the old path; a rename back must not revive it)."""
        under = under_any(prefixes)
        for directory in [d for d in self._names_copied if under(d)]:
            self._names_later[directory] = None  # gone from the export: the backup's copy goes
        for directory in [d for d in self._owned if under(d)]:
            self._owned.discard(directory)
            if self.owners is None:
                continue
            for prefix in prefixes:
                if directory == prefix or directory.startswith(prefix.rstrip("/") + "/"):
                    for other in prefixes:
                        if other != prefix:
                            self.owners.unmark_moved(directory, other + directory[len(prefix):])

    # -- the names copied to the backup (see the module) ------------------------------

    async def flush_names(self) -> None:
        """Send each backup the names changed since the last batch in the directories this node
        copies (the daemon calls this every second); a backup that does not answer gets them with
        the next batch. A directory gone from the export, split, or no longer homed here has its
        copy emptied and is no longer copied."""
        batches, self._names_later = self._names_later, {}
        for directory, names in batches.items():
            if directory in self._names_copied:
                await self._send_names(directory, names)

    async def _send_names(self, directory: str, names: set[str] | None) -> None:
        me = self._peers.me
        backup = self._backup_node(directory)
        if backup is None:
            self._names_copied.discard(directory)
            self._names_unsent.discard(directory)
            return
        if self._peers.is_down(backup):  # (a flush must not wait for it once per directory)
            self._requeue(directory, names)
            return
        unsent = directory in self._names_unsent  # the backup holds no names of it from this node
        built = self._dirs.get(directory)
        stop = directory in self._parts
        whole = names is None or built is None or stop
        changes: list[SyncEntry] = []
        if stop:
            pass  # an empty copy: the partitions' servers have the names now
        elif whole:
            try:
                listing = await list_whole(self._peers, me, directory) or []
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    log.info("cannot list %s to copy its names to the backup %s: %s", directory, backup, exc)
                    self._names_later[directory] = None
                    return
                listing, stop = [], True  # gone from this export
            changes = [SyncEntry(*entry) for entry in listing if entry.replica_of is None]
        else:
            assert names is not None and built is not None
            waiting: set[str] = set()
            for name in sorted(names):
                holder = built.entries.get(name, {}).get(me)
                if holder is None or holder.replica_of is not None:
                    changes.append(SyncEntry(name, None))
                elif holder.attr is None:
                    waiting.add(name)  # claimed, its attributes not known yet (the scan brings them)
                else:
                    changes.append(SyncEntry(name, holder.attr))
            if waiting:
                later = self._names_later.setdefault(directory, set())
                if later is not None:
                    later.update(waiting)
            if not changes:
                return
        if unsent and not changes:  # an empty copy would change nothing there: a directory made and
            if stop:                # removed again before it held a name costs its backup no message
                self._names_copied.discard(directory)
                self._names_unsent.discard(directory)
            return
        try:
            for start in range(0, max(len(changes), 1), PAGE):
                await self._peers.ask(backup, msg.IndexOwned(directory, me, changes[start:start + PAGE],
                                                             whole and start == 0), timeout=self.ask_timeout)
        except OSError as exc:
            log.info("could not copy the names of %s to its backup %s: %s", directory, backup, exc)
            self._requeue(directory, None if whole else names)
            return
        self._copied += len(changes)
        self._names_unsent.discard(directory)
        if stop:
            self._names_copied.discard(directory)

    def _requeue(self, directory: str, names: set[str] | None) -> None:
        """`names` (None: all) go with the next batch, with the names changed since."""
        later = self._names_later.get(directory, set())
        self._names_later[directory] = None if names is None or later is None else later | names

    async def op_owned(self, request: msg.IndexOwned) -> None:
        """A batch of the names `home` holds in `directory`, a directory it owns(ed), kept here
        as its backup for the day this node stands in for it (`_held_by_dead_home`)."""
        directory, home = request.directory, request.home
        kept = self._owned_copies.get(directory)
        names = {} if request.whole or kept is None or kept[0] != home else kept[1]
        for entry in request.changes:
            if entry.attr is None:
                names.pop(entry.name, None)
            else:
                names[entry.name] = Holder(entry.attr.is_dir, entry.attr)
        if names:
            self._owned_copies[directory] = (home, names)
        else:
            self._owned_copies.pop(directory, None)

    def _held_by_dead_home(self, directory: str, entries: Entries) -> None:
        """Standing in for `directory`'s home, which could not be listed: the names it copied here
        are its, as last copied (an open of one fails: the home is down; a create finds it)."""
        home = self._backing.get(directory)
        kept = self._owned_copies.get(directory)
        if home is None or kept is None or kept[0] != home:
            return
        for name, holder in kept[1].items():
            entries.setdefault(name, {}).setdefault(home, holder)

