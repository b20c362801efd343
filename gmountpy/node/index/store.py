"""The state a home keeps for the directories it is home of, and the primitives on it.

A home keeps, per directory: the built entries (`entries`), the changes that arrive
while it is being built, and three lease tables -- who was told "not found" for a name,
who was told a subdirectory's home, and who holds the whole listing. A lease is a
promise: before a change makes it untrue, the home tells the holder (`_tell`), so a
node may answer from what it was told while its lease lasts (docs/design.md, the
hand-off contract). Leases are kept apart from the entries: a rebuild must not forget
who holds a "not found", or a create would not revoke it.

A home holds what it still promises and what is in use: leases that ended are forgotten,
and a directory's index that nobody asked for in `keep_idle` seconds is let go (it is
built again from the exports when next asked) unless a lease on its names is still live or
a create in it is under way.

`IndexStore` is the bottom layer of the home's side: `partitions` (Giga+ splitting),
`records` (the homes of subdirectories) and `directory` (the operations served) build
on it.
"""

from __future__ import annotations

import errno
import logging
import math
from collections import Counter
from collections.abc import Sequence
from contextvars import ContextVar

import trio

from ..._trio import open_nursery
from ...protocol import messages as msg
from ...protocol.messages import DirEntry, Request
from ..leases import Leases
from ..locator import ANNOUNCE_TIMEOUT
from .entries import BuiltDirectory, Change, Holder, Parts, Removals, apply_change
from .homes import Homes, home_lease_for
from .marks import Owners
from .paths import join, under_any
from .peers import Peers, list_in_pages

log = logging.getLogger(__name__)

#: Set while a request is served as the backup of a home that did not answer (`index_backup`).
AS_BACKUP: ContextVar[str | None] = ContextVar("gmount_index_as_backup", default=None)


class IndexStore:
    """What a home keeps, and how it changes it. The constructor's parameters:

    `order`: every node (the listings of a directory come from all of them).
    `lease`: seconds a "not found" handed out stays recorded (and so revoked by a create).
    `rescan`: seconds after which a directory is listed again (0: never).
    `ask_timeout`: how long the home waits for a node it asks (a listing, a holder's attributes);
    shorter than the askers' own timeout, so one hung node makes a directory incomplete
    rather than its home look dead.
    `homes`: the rules for the homes of subdirectories. With it, a lookup of a subdirectory
    answers its home too (recorded here: at its creator's site for a directory made through
    the mount, else by `Homes.of_holders`), leased to the asker for `home_lease` seconds and
    revoked when the subdirectory goes; the records are copied to this directory's backup.
    `listing_lease`: seconds an asker may keep a whole listing (`index_list`); any change in the
    directory revokes it. `backup_refresh`: a directory served as a backup is listed again
    from the exports when older than this (its home may have been back meanwhile).
    `verify_misses`: before it answers "no such name" -- to a lookup or a create -- this home
    asks the other nodes whose export has the directory (not every node): a file copied
    straight into an export since that node's last scan is then found at once (no ENOENT,
    no twin), at the cost of those messages on every miss and create (a miss is still leased).
    `keep_idle`: seconds a directory's index is kept without a request reading it (0: for
    ever); longer than `rescan`, after which it would be listed again anyway.
    `owners`: the marks of this node's export: with it, the directories this node made and
    nobody else touches are owned here (see `owners`).
    """

    def __init__(self, peers: Peers, order: Sequence[str], *, lease: float, rescan: float = 30.0,
                 revoke_timeout: float = ANNOUNCE_TIMEOUT, ask_timeout: float | None = None,
                 homes: Homes | None = None, home_lease: float | None = None, listing_lease: float = 1.0,
                 backup_refresh: float = 1.0, verify_misses: bool = False, split_entries: int = 0,
                 keep_idle: float = 120.0, owners: Owners | None = None) -> None:
        home_lease = home_lease_for(lease) if home_lease is None else home_lease
        if split_entries < 0:
            raise ValueError(f"`split_entries` must be non-negative (0: never split), got {split_entries!r}")
        if lease < 0:
            raise ValueError(f"`lease` must be non-negative, got {lease!r}")
        if rescan < 0:
            raise ValueError(f"`rescan` must be non-negative, got {rescan!r}")
        if keep_idle < 0:
            raise ValueError(f"`keep_idle` must be non-negative (0: for ever), got {keep_idle!r}")
        if home_lease < 0 or listing_lease < 0:
            raise ValueError(f"`home_lease` and `listing_lease` must be non-negative, got {home_lease!r}, "
                             f"{listing_lease!r}")
        self._peers = peers
        self.order = list(order)
        self.lease = lease
        self.rescan = rescan
        self.revoke_timeout = revoke_timeout
        self.ask_timeout = ask_timeout
        self.homes = homes
        self.home_lease = home_lease
        self.listing_lease = listing_lease
        self.backup_refresh = backup_refresh
        self.verify_misses = verify_misses
        self.keep_idle = keep_idle
        self._swept = -math.inf  # when idle indexes were last let go
        self._evictions = 0
        # directory -> subdirectory name -> its home. Kept apart from the entries: a rebuild
        # must not move a directory's home (askers hold it under a lease).
        self._child_homes: dict[str, dict[str, str]] = {}
        self._home_leases = Leases()     # who was told the home of a subdirectory
        self._listing_leases = Leases()  # who holds a whole listing (the name `WHOLE`)
        self._backing: dict[str, str] = {}  # directory -> the home this node stands in for
        self._listings = self._taken_over = 0
        self._dirs: dict[str, BuiltDirectory] = {}
        self._building: dict[str, list[Change]] = {}  # directory -> changes that arrived meanwhile
        self._built: dict[str, trio.Event] = {}
        self._outdated: set[str] = set()  # forgotten while being built: built again when next asked
        # who was told "not found" for a name. Kept apart from the entries: a rebuild must
        # not forget who holds a "not found", or a create would not revoke it.
        self._negatives = Leases()
        # names removed through a mount lately: an export scan's report older than the removal
        # must not bring them back (kept apart from the entries, which a rebuild replaces)
        self._removed = Removals()
        self._builds = self._lookups = self._leased = self._revocations = 0
        # Giga+ splitting (`split_entries` > 0: a partition holding more names splits in two)
        self.split_entries = split_entries if homes is not None and homes.central is None else 0
        self._parts: dict[str, Parts] = {}             # split directories this node knows of
        self._split_check: dict[str, int] = {}         # directory -> entries here before counting again
        self._active: Counter[str] = Counter()         # directory -> requests being served
        self._closed: dict[str, trio.Event] = {}       # directory -> set when its split here is done
        self._drained: dict[str, trio.Event] = {}      # directory -> set when its last request is done
        self._splits = self._redirects = 0
        self._operations: msg.Operations | None = None
        # directories owned here (owners.OwnedDirectories): their creates need telling nobody
        self.owners = owners
        self._owned: set[str] = set()
        self._unsettled: set[str] = set()           # no longer owned, the export not listed into the index yet
        self._draining: dict[str, trio.Event] = {}  # directory -> set when its ownership has ended
        self._own_checked: dict[str, float] = {}    # directory -> when owning it again was last considered
        self._ownerships = self._releases = 0
        self._records_later: dict[str, dict[str, str | None]] = {}  # record copies for the next batch
        # the names of directories this node owned, copied to their backups in batches (owners)
        self._names_copied: set[str] = set()                # directories whose names are copied
        self._names_unsent: set[str] = set()                # ... made here, their backup sent no name yet
        self._names_later: dict[str, set[str] | None] = {}  # names changed since the last batch (None: all)
        self._copied = 0                                    # names sent to backups so far
        # as a backup: directory -> (the home that owned it, the names it holds there, as last copied)
        self._owned_copies: dict[str, tuple[str, dict[str, Holder]]] = {}

    def _tidy(self) -> None:
        """Forget the leases that ended; every `keep_idle` / 4 seconds, let go of the directory
        indexes nobody read for `keep_idle` seconds (see the module)."""
        now = trio.current_time()
        for leases in (self._negatives, self._home_leases, self._listing_leases):
            leases.expire(now)
        self._removed.expire(now)
        if self.keep_idle <= 0 or now - self._swept < self.keep_idle / 4:
            return
        self._swept = now
        for directory in [d for d, built in self._dirs.items() if self._idle(d, built, now)]:
            del self._dirs[directory]
            self._backing.pop(directory, None)
            self._split_check.pop(directory, None)
            self._evictions += 1

    def _idle(self, directory: str, built: BuiltDirectory, now: float) -> bool:
        """Whether `directory`'s index may go: unread for `keep_idle` seconds, and nothing it
        alone would carry over -- a live "not found" or listing lease (a change seen only by
        comparing with the index must revoke them), a create under way, a split, a request
        or a build in progress."""
        return (now - max(built.built_at, built.used) >= self.keep_idle and directory not in self._parts
                and directory not in self._building and directory not in self._active
                and directory not in self._closed and not self._negatives.names(directory)
                and not self._listing_leases.names(directory) and not built.claimed(now))

    async def _ownership_gate(self, directory: str) -> None:
        """Before a request about `directory` is served (owners.OwnedDirectories)."""

    async def _end_ownership(self, directory: str) -> None:
        """End this node's ownership of `directory` (owners.OwnedDirectories)."""

    async def _forgotten(self, prefixes: list[str]) -> None:
        """Before the directories under `prefixes` are forgotten (owners.OwnedDirectories)."""

    def _leases_held(self) -> int:
        return len(self._negatives) + len(self._home_leases) + len(self._listing_leases)

    def forget_all(self) -> None:
        """Drop every built directory (a node restarted: its export may differ); leases are kept.
        Every node does this at once (`set_peers`), so split directories start unsplit again
        everywhere and split anew as they grow."""
        self._dirs.clear()
        self._parts.clear()
        self._split_check.clear()
        # the owners' copies kept here may predate the restart; each owner sends its names again
        self._owned_copies.clear()
        for directory in self._names_copied:
            self._names_later[directory] = None

    async def _list(self, node: str, directory: str) -> list[DirEntry] | None:
        try:
            # a stand-in does not ask to be told of changes: those go to the home, back soon; the
            # server of a partition has them go to the home too, which passes them on to every partition
            parts = self._parts.get(directory)
            me = None if directory in self._backing else parts.home if parts is not None else self._peers.me
            return await self._peers.ask(node, msg.IndexListdir(directory, me), timeout=self.ask_timeout)
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
        return await list_in_pages(self._peers, node, directory)

    def _change(self, directory: str, change: Change) -> None:
        """Apply to the built directory, and log it for a build under way."""
        current = self._dirs.get(directory)
        if current is not None:
            apply_change(current.entries, change)
        if directory in self._names_copied:
            later = self._names_later.setdefault(directory, set())
            if later is not None:
                later.add(change[0])
        building = self._building.get(directory)
        if building is not None:
            building.append(change)

    def _complete(self, directory: str, built: BuiltDirectory) -> bool:
        """Every node was listed -- or, standing in for a home that does not answer, every node but
        that home: its files cannot be reached by anyone now, and misses are then answered
        without a lease (so nobody keeps them)."""
        stand_in = self._backing.get(directory)
        return all(node == stand_in for node in built.missing)

    def _serving_as_backup(self, directory: str) -> bool:
        """Whether this request is served for a home that did not answer (a normal request for the
        directory means this node is its home again: it leaves the stand-in mode)."""
        stand_in = AS_BACKUP.get()
        if stand_in is None:
            if self._backing.pop(directory, None) is not None:
                self._dirs.pop(directory, None)  # built as a stand-in: not trusted as the home's own
            return False
        if self._backing.get(directory) != stand_in:
            self._backing[directory] = stand_in
            self._dirs.pop(directory, None)  # taking over: list it from the exports now
        return True

    async def _tell(self, leases: dict[str, float], request: Request[None], *, but: str | None) -> None:
        """Send `request` to every node whose lease has not expired (a revocation), `but` one."""
        now = trio.current_time()

        async def tell(node: str) -> None:
            self._revocations += 1
            try:
                with trio.move_on_after(self.revoke_timeout):
                    await self._peers.ask(node, request)
            except OSError as exc:
                log.info("could not tell %s %s: %s", node, request, exc)

        async with open_nursery() as nursery:
            for node, until in leases.items():
                if until > now and node != but:
                    nursery.start_soon(tell, node)

    async def _revoke(self, directory: str, name: str, is_dir: bool, *, but: str | None,
                      everyone: bool = False) -> None:
        """Tell every node holding an unexpired "not found" for the name that it exists now.
        `everyone`: a stand-in for a dead home, which does not know whom that home told:
        every node is told."""
        leases = self._negatives.revoke(directory, name)
        if everyone:
            leases = {node: float("inf") for node in self.order if node != self._peers.me}
        if not leases:
            return
        await self._tell(leases, msg.Created(join(directory, name), is_dir), but=but)

    def forget(self, prefixes: list[str]) -> None:
        under = under_any([str(prefix) for prefix in prefixes])
        for directory in [d for d in self._names_copied if under(d)]:
            self._names_later[directory] = None  # the next batch sends what the export holds
        for directory in [d for d in self._dirs if under(d)]:
            del self._dirs[directory]
        for directory in self._building:
            if under(directory):
                self._outdated.add(directory)  # its listings under way may predate the change
