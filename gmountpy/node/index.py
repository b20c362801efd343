"""Lookups that never flood: a homed directory index behind the `Locator` seam (issue 13).

Every directory has a **home** node (`lookup = "index"`), or one fixed node for
every directory (`lookup = "central"`, the central-metadata baseline). The
home keeps the exact index of that directory -- name -> holders, each with
its attributes -- and answers in one round trip: who holds this name
(`index_lookup`), the whole directory (`index_list`), may this node create it
(`index_claim`), and here is a change (`index_set`, `index_drop`,
`index_replace`, `index_rename` -- a drop and a replace in one message --,
`index_forget`). Every `index_*` operation is asked with its
typed request in gmountpy.protocol.messages (`IndexLookup` answers an
`IndexLookupReply`, ...), as every other operation of a node is.

Where homes are (`Homes`). The issue asked for rendezvous hashing of the path
over all nodes, "preferring the creator's site". Hashing over all nodes puts
3 of 4 directories of a 2-site cluster at the other site; so here a directory
made by a mkdir through the mount is homed at its creator's site (rendezvous
over that site's nodes), and one found in the exports at the site of its
holders' rendezvous winner (the same answer while only its creator holds it).
Such a home cannot be computed from the path, so it is *recorded* in the
parent's index: the parent's home returns it with the lookup (or listing) of
the directory and leases it to the asker (`home_lease`, a minute; revoked by
`index_unhome` when the directory is removed or renamed); the records are
copied to the parent home's backup. Only the root's home is hashed. The
kernel looks a directory up before any name in it, so once a node has seen a
directory a lookup in it is one round trip to one node; a node that only ever
saw the directory in its own export asks the parent's home once first.

A node looks a path up in its own export first (0 messages), then in its
short caches (0), then asks the home (1 round trip); a miss is the home's
negative answer, never a search of every node. A negative answer is a
*lease*: the home remembers who was told "not found" and, before a claim or a
new name returns, tells those nodes (the `created` operation, which also
drops the kernel's negative entries). So hand-off rule 1 holds with one round
trip per create. Listings are leased the same way (about a second; any change
in the directory revokes them with `index_unlist`, except to the node that made
the change: a chmod, utimens, truncate, unlink or rename of a file it asked for it
applies to its copy itself, and keeps it; after other changes it drops it). A
node that has found a few names in one directory through its home asks for the
listing with the next lookup (same round trip) and answers later names in it
from that listing while the lease lasts (`LIST_AHEAD_AFTER`): reading, changing
or renaming many files of one remote directory costs about one round trip per
second for their lookups, not one per file.

The index is soft state. A home builds a directory's index on first demand by
asking every node once for its listing of that directory (a directory just
made by a mkdir through the mount is *seeded* empty instead: by the parent's
home during the claim when the new home is that node or its backup, which
gets the record copy anyway (or is the creator, which keeps that copy
itself); else by the creator with `index_seed`),
and again when it is older than `tuning.index_rescan` seconds: files written
straight into an export (outside the mount) reach the home at that node's
next export scan (ExportWatcher), at the latest after the rescan (at once on
their own node, whose export is read first). Changes that arrive while a
directory is being built are replayed over the listings; claims not yet
visible on disk survive a rebuild.

A change to a file (chmod, utimens, truncate, unlink, a rename within its
directory) is made on its holder and then recorded at the home. When the home
is nearer the holder than the asker (at the holder's site, the asker at
another), the asker sends the change to the holder as `recorded` and the
holder records it (IndexLocator.change): one round trip across the WAN, not
two. A removed directory's own index is forgotten by its parent's home, with
the drop (itself, in the record copy to its backup, or one message); a remover
that is the parent home's backup drops its copy of the record itself.

A home that does not answer is replaced by its **backup** (the next node of
its site): the asker sends the request to it as `index_backup`; the backup
lists the directory from the exports (the dead home's own files are out of
everyone's reach), answers without leases, and tells every node of each new
name (it cannot know whom the dead home had told "not found"). Changes made
through the backup are owed to the home, which lists those directories again
when it answers again (a restarted home takes the homes of new
subdirectories from its backup). Only when the backup does not answer either
does a node fall back to GMount's search (FloodLocator), with an uncacheable
ENOENT for misses.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import trio

from .._trio import open_nursery
from ..errors import PeerUnavailable
from ..protocol import messages as msg
from ..protocol.attr import Attr
from ..protocol.messages import DirEntry, IndexHolder, IndexListReply, IndexLookupReply, R, Request
from .locator import (
    ANNOUNCE_TIMEOUT,
    AbsentForNow,
    FloodLocator,
    FloodPeers,
    Location,
    LocatorStatistics,
    drop_expired,
)

log = logging.getLogger(__name__)

#: A claim whose file the home cannot see on its holder yet counts as "being created" this long
#: (a create takes milliseconds; this covers a loaded node); after that (the creator died, or its
#: create failed and the withdrawal was lost) it is dropped. Meanwhile a create of the same name
#: elsewhere fails with EAGAIN.
CLAIM_GRACE = 10.0
#: Entries in one listdir reply before a home pages through a snapshot (service.LISTDIR_MAX).
_PAGE = 50_000
#: Holders a home asks at once for the attributes of names claimed or renamed, to list a directory.
_RESOLVE_AT_ONCE = 64
#: Listing ahead (IndexFS-style directory leases for lookups): after LIST_AHEAD_AFTER names found in
#: one directory through its home (misses between them do not count: a rename looks its new name
#: up too), a node asks for the whole listing instead -- one round
#: trip, the same as a name -- and answers later names in it from that listing while the home's
#: lease lasts (any change there revokes it). Only for directories of at most LIST_AHEAD_MAX names,
#: not split, and not while they change: a listing that went before its lease ran out keeps the
#: directory to one name at a time for LIST_AHEAD_QUIET seconds. "Not found" is never answered from
#: a listing (the kernel's negative entries are revoked per name, by the home's "created").
LIST_AHEAD_AFTER = 2
LIST_AHEAD_MAX = 4096
LIST_AHEAD_QUIET = 5.0
LIST_AHEAD_KEPT = 4096  # directories whose streaks and early drops are remembered
#: Listings a node keeps at most (readdir's and listed ahead); expired ones go first, then the oldest.
LISTINGS_KEPT = 1024


class Peers(Protocol):
    """What the index needs of the peer pool (PeerPool, or a test's in-memory network): `ask` with
    the typed requests of gmountpy.protocol.messages; `call` passes a node's own listing on untouched."""

    me: str

    async def ask(self, node: str, request: Request[R], *, timeout: float | None = None) -> R: ...
    async def call(self, node: str, op: str, *args: Any, timeout: float | None = None) -> Any: ...
    def is_down(self, node: str) -> bool: ...


class LocatorPeers(Peers, FloodPeers, Protocol):
    """The index locator's peers: the index's, and the flooding search's it falls back to."""


# -- where a directory lives --------------------------------------------------------------------


def _weight(node: str, directory: str) -> int:
    digest = hashlib.blake2b(f"{node}\0{directory}".encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(directory: str, nodes: Sequence[str]) -> list[str]:
    """All nodes, the home of `directory` first (highest rendezvous weight; ties by name)."""
    return sorted(nodes, key=lambda node: (-_weight(node, directory), node))


# -- Giga+ partitions of a large directory's index ---------------------------------------------


def name_hash(name: str) -> int:
    """The stable hash of a name that places it in a partition (every node computes the same)."""
    digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8, person=b"gmount-part").digest()
    return int.from_bytes(digest, "big")


def partition_of(hashed: int, bitmap: Collection[int]) -> int:
    """Giga+'s mapping: the partition of a name whose hash is `hashed`, given the partitions known
    to exist (`bitmap`): `hashed mod 2**r` for the largest r that names an existing partition."""
    if not bitmap:
        return 0
    for depth in range(max(bitmap).bit_length(), -1, -1):
        index = hashed & ((1 << depth) - 1)
        if index in bitmap:
            return index
    return 0


def partition_depth(partition: int, bitmap: Collection[int]) -> int:
    """The radix depth of `partition`: it was made at depth `partition.bit_length()` and every
    split since made the child `partition + 2**depth` (exact when `bitmap` has all its children,
    as on the node that serves it: only that node splits it)."""
    depth = partition.bit_length()
    while partition + (1 << depth) in bitmap:
        depth += 1
    return depth


@dataclass(frozen=True)
class Homes:
    """Where directories live: the rules every node applies the same way.

    `central` set: that node is the home of every directory (the baseline of a
    central metadata server). Otherwise:

    - the root's home is the rendezvous winner over every node (`home`);
    - a directory made through the mount is homed at its creator's site: the
      rendezvous winner among that site's nodes (`of_creator`), so the files a
      site makes and looks up stay one intra-site round trip away;
    - a directory found in the exports (no creator known) is homed at a site
      that holds it (`of_holders`): for a directory only its creator holds, the
      same answer as `of_creator`; held at several sites, the one with the
      smallest total RTT to every node (`site_rtt`), so askers from anywhere
      reach it soonest on average; of sites with equal totals, the one whose
      farthest node is nearest, so the slowest asker waits least (still tied,
      or no RTTs: the site of the rendezvous winner among the holders).

    Only the root's home can be computed from a path alone; every other home
    is recorded in its parent's index and handed out with lookups (see
    DirectoryIndex). The backup is the next-ranked node at the home's site,
    else the next-ranked node.
    """

    nodes: tuple[str, ...]
    site_of: dict[str, str] = field(default_factory=dict)
    central: str | None = None
    site_rtt: dict[tuple[str, str], float] = field(default_factory=dict)  # (site, site) -> ms, the overlay's

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("`nodes` must name at least one node")
        if self.central is not None and self.central not in self.nodes:
            raise ValueError(f"`central` must be one of the nodes, got {self.central!r}")

    def home(self, directory: str) -> str:
        """The home by hashing over every node: the root's (and, with `central`, everyone's)."""
        if self.central is not None:
            return self.central
        return max(self.nodes, key=lambda node: (_weight(node, directory), node))

    def at_site(self, directory: str, site: str | None) -> str:
        """The rendezvous winner among the nodes of `site` (every node if it has none)."""
        if self.central is not None:
            return self.central
        members = [node for node in self.nodes if self.site_of.get(node) == site] or list(self.nodes)
        return max(members, key=lambda node: (_weight(node, directory), node))

    def of_creator(self, directory: str, creator: str) -> str:
        """The home of a directory `creator` made: at the creator's site."""
        return self.at_site(directory, self.site_of.get(creator))

    def of_holders(self, directory: str, holders: Sequence[str]) -> str:
        """The home of a directory found on `holders`: at the holding site nearest to every node."""
        known = [node for node in holders if node in self.nodes]
        if self.central is not None or not known:
            return self.home(directory)
        sites = {self.site_of.get(node) for node in known}
        if len(sites) > 1 and self.site_rtt:
            def cost(site: str | None) -> tuple[float, float]:
                rtts = [self.site_rtt.get((str(site), str(self.site_of.get(node))), 0.0) for node in self.nodes]
                return round(sum(rtts), 6), max(rtts)

            best = min(cost(site) for site in sites)
            known = [node for node in known if cost(self.site_of.get(node)) == best]
        first = max(known, key=lambda node: (_weight(node, directory), node))
        return self.at_site(directory, self.site_of.get(first))

    def of_partition(self, directory: str, partition: int) -> str:
        """The server of partition `partition` > 0 of a split directory (partition 0 is at its home):
        rendezvous over every node, so the partitions of a hot directory spread over the cluster."""
        if self.central is not None:
            return self.central
        key = f"{directory}\0#{partition}"
        return max(self.nodes, key=lambda node: (_weight(node, key), node))

    def backup(self, directory: str, home: str | None = None) -> str | None:
        """Who takes over when `home` (by default the hashed home) does not answer."""
        order = rendezvous_order(directory, self.nodes)
        home = home or self.central or order[0]
        rest = [node for node in order if node != home]
        same_site = [node for node in rest if self.site_of.get(node) == self.site_of.get(home)]
        candidates = same_site or rest
        return candidates[0] if candidates else None


def home_lease_for(lease: float) -> float:
    """How long a directory's home is leased to a node: a minute, and at least twice the
    "not found" lease (a "not found" is kept no longer than the home that gave it is known)."""
    return max(60.0, 2 * lease)


def split_parent(path: str) -> tuple[str, str]:
    """("/a/b", "c") for "/a/b/c"; ("/", "c") for "/c"."""
    directory, _, name = path.rpartition("/")
    return directory or "/", name


def _join(directory: str, name: str) -> str:
    return "/" + name if directory == "/" else f"{directory}/{name}"


def _under(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def _under_any(prefixes: Collection[str]) -> Callable[[str], bool]:
    """`_under(path, p)` for some p of `prefixes`, as one test: a directory removal or rename
    scans whole caches with it, and one startswith of a tuple is a third of the cost of a
    generator of `_under` calls (200k paths: 28 against 84 ms)."""
    if "/" in prefixes:
        return lambda path: True
    exact = frozenset(prefixes)
    below = tuple(prefix + "/" for prefix in prefixes)
    return lambda path: path in exact or path.startswith(below)


# -- the home's side -------------------------------------------------------------------------------


@dataclass
class _Holder:
    is_dir: bool
    attr: Attr | None              # None: claimed (being created) or renamed here; asked of the holder
    replica_of: str | None = None  # a staged replica of that node's file
    since: float | None = None     # when a claim or a close told the home (None: from a listing)
    renamed: bool = False          # attr None after a rename: the file exists; asked of its holder when listed

    def recent(self, now: float) -> bool:
        """Told by a claim or a close within CLAIM_GRACE: newer than a scan's listing may be."""
        return self.since is not None and now - self.since < CLAIM_GRACE


_Entries = dict[str, dict[str, _Holder]]          # name -> node -> holder
_Change = tuple[str, str | None, _Holder | None]  # (name, node or None = every node, holder or None = removed)


@dataclass
class _Directory:
    entries: _Entries
    built_at: float
    missing: tuple[str, ...]  # nodes that could not be listed: misses are not definite
    exists: bool = True       # some node listed it (an empty index of a missing directory is not a listing)
    holders: set[str] = field(default_factory=set)  # nodes whose export has the directory (as far as known)


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


#: Set while a request is served as the backup of a home that did not answer (`index_backup`).
_AS_BACKUP: ContextVar[str | None] = ContextVar("gmount_index_as_backup", default=None)
#: Operations a backup serves for a home that does not answer.
_BACKED_OPS = ("index_lookup", "index_claim", "index_set", "index_drop", "index_replace", "index_rename",
               "index_list")
#: Operations on one name of a directory: served by the partition the name hashes to.
_NAME_OPS = ("index_lookup", "index_claim", "index_set", "index_drop", "index_replace", "index_rename")
#: Operations on one directory that wait while a partition of it splits on this node.
_GATED_OPS = (*_BACKED_OPS, "index_sync", "index_adopt")
#: Operations sent to a partition's server (`index_part`).
_PART_OPS = (*_BACKED_OPS, "index_sync")
#: Changes to a file that its holder records at the directory's home for a far asker (`recorded`).
_RECORDED_OPS = ("chmod", "utimens", "truncate", "unlink", "rename")
#: No directory splits into more partitions than this (a bound on the bitmap sent with requests).
MAX_PARTITIONS = 1 << 12
#: Redirects a request for a name of a split directory may meet before the asker gives up on
#: the index (and asks every node): one per level its map is behind, and one from the home.
_MAX_HOPS = 8


@dataclass
class _Parts:
    """What this node knows of a split directory: its home (the server of partition 0) and the
    partitions known to exist (Giga+'s bitmap). The partitions this node serves follow from them
    (`Homes.of_partition`); every partition it serves has all its children in `bitmap` (only
    this node splits them), so its names are exactly those `partition_of` maps to it."""

    home: str
    bitmap: set[int]


class _Misdirected(OSError):
    """A request for a name this node does not serve (its directory is split): the asker learns
    `bitmap` and asks the right node. Over the wire (a plain request) it is ESTALE."""

    def __init__(self, directory: str, name: str, me: str, bitmap: set[int]) -> None:
        super().__init__(errno.ESTALE, f"{_join(directory, name)} is in a partition of the split directory "
                                       f"{directory} that node {me} does not serve; ask its server")
        self.bitmap = sorted(bitmap)


class DirectoryIndex:
    """The index a home keeps for the directories it is home of, served as `index_*` operations.

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
    """

    def __init__(self, peers: Peers, order: Sequence[str], *, lease: float, rescan: float = 30.0,
                 revoke_timeout: float = ANNOUNCE_TIMEOUT, ask_timeout: float | None = None,
                 homes: Homes | None = None, home_lease: float | None = None, listing_lease: float = 1.0,
                 backup_refresh: float = 1.0, verify_misses: bool = False, split_entries: int = 0) -> None:
        home_lease = home_lease_for(lease) if home_lease is None else home_lease
        if split_entries < 0:
            raise ValueError(f"`split_entries` must be non-negative (0: never split), got {split_entries!r}")
        if lease < 0:
            raise ValueError(f"`lease` must be non-negative, got {lease!r}")
        if rescan < 0:
            raise ValueError(f"`rescan` must be non-negative, got {rescan!r}")
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
        # directory -> subdirectory name -> its home. Kept apart from the entries: a rebuild
        # must not move a directory's home (askers hold it under a lease).
        self._child_homes: dict[str, dict[str, str]] = {}
        self._home_leases: dict[str, dict[str, dict[str, float]]] = {}  # directory -> name -> asker -> expiry
        self._listing_leases: dict[str, dict[str, float]] = {}          # directory -> asker -> expiry
        self._backing: dict[str, str] = {}  # directory -> the home this node stands in for
        self._listings = self._taken_over = 0
        self._dirs: dict[str, _Directory] = {}
        self._building: dict[str, list[_Change]] = {}  # directory -> changes that arrived meanwhile
        self._built: dict[str, trio.Event] = {}
        self._outdated: set[str] = set()  # forgotten while being built: built again when next asked
        # directory -> name -> node -> lease expiry. Kept apart from the entries: a rebuild
        # must not forget who holds a "not found", or a create would not revoke it.
        self._negatives: dict[str, dict[str, dict[str, float]]] = {}
        self._builds = self._lookups = self._leased = self._revocations = 0
        # Giga+ splitting (`split_entries` > 0: a partition holding more names splits in two)
        self.split_entries = split_entries if homes is not None and homes.central is None else 0
        self._parts: dict[str, _Parts] = {}            # split directories this node knows of
        self._split_check: dict[str, int] = {}         # directory -> entries here before counting again
        self._active: Counter[str] = Counter()         # directory -> requests being served
        self._closed: dict[str, trio.Event] = {}       # directory -> set when its split here is done
        self._drained: dict[str, trio.Event] = {}      # directory -> set when its last request is done
        self._splits = self._redirects = 0
        self._operations: dict[str, Callable[..., Awaitable[Any]]] | None = None

    def operations(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The RPC operations, for NodeService's `extra` table (made once: `op_part` dispatches on them)."""
        if self._operations is not None:
            return self._operations
        ops: dict[str, Callable[..., Awaitable[Any]]] = {
            "index_lookup": self.op_lookup, "index_claim": self.op_claim, "index_set": self.op_set,
            "index_drop": self.op_drop, "index_replace": self.op_replace, "index_rename": self.op_rename,
            "index_forget": self.op_forget,
            "index_sync": self.op_sync, "index_list": self.op_list, "index_backup": self.op_backup,
            "index_records": self.op_records, "index_seed": self.op_seed, "index_adopt": self.op_adopt}
        for op in _GATED_OPS:
            ops[op] = self._gated(op, ops[op])
        ops.update({"index_part": self.op_part, "index_split": self.op_split, "index_parts": self.op_parts})
        self._operations = ops
        return ops

    def forget_all(self) -> None:
        """Drop every built directory (a node restarted: its export may differ); leases are kept.
        Every node does this at once (`set_peers`), so split directories start unsplit again
        everywhere and split anew as they grow."""
        self._dirs.clear()
        self._parts.clear()
        self._split_check.clear()

    def statistics(self) -> IndexStatistics:
        partitions = entries = 0
        for directory, parts in self._parts.items():
            partitions += len(self._served_here(directory, parts))
            built = self._dirs.get(directory)
            entries += len(built.entries) if built is not None else 0
        return IndexStatistics(len(self._dirs), self._builds, self._lookups, self._leased, self._revocations,
                               self._listings, self._taken_over, self._splits, partitions, entries,
                               self._redirects)

    # -- building ------------------------------------------------------------

    async def _directory(self, directory: str) -> _Directory:
        while True:
            now = trio.current_time()
            current = self._dirs.get(directory)
            if directory in self._backing:
                fresh = self.backup_refresh > 0 and now - (current.built_at if current else now) < self.backup_refresh
            else:
                fresh = self.rescan <= 0 or now - (current.built_at if current else now) < self.rescan
            if current is not None and self._complete(directory, current) and fresh:
                return current
            event = self._built.get(directory)
            if event is None:
                return await self._build(directory)
            await event.wait()
            built = self._dirs.get(directory)
            if built is not None:
                return built  # as built just now, even with nodes missing: do not list again at once

    async def _build(self, directory: str) -> _Directory:
        self._builds += 1
        self._built[directory] = done = trio.Event()
        changes: list[_Change] = []
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
            entries: _Entries = {}
            for node, listing in listings.items():
                for entry in listing:
                    entries.setdefault(entry.name, {})[node] = _Holder(entry.attr.is_dir, entry.attr, entry.replica_of)
            old = self._dirs.get(directory)
            if old is not None:  # claims whose files are not on disk yet survive the rebuild
                for name, holders in old.entries.items():
                    for node, holder in holders.items():
                        if holder.attr is None and node not in entries.get(name, {}):
                            entries.setdefault(name, {})[node] = holder
            for change in changes:  # what happened while the listings were taken, in order
                _apply(entries, change)
            if directory in self._parts:  # split: only the names of the partitions served here
                entries = {name: holders for name, holders in entries.items() if self._mine(directory, name)}
            built = _Directory(entries, started, tuple(sorted(missing)), bool(listings), set(listings))
            await self._settle_homes(directory, entries)
            for name in [name for name in self._negatives.get(directory, {}) if entries.get(name)]:
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
        return await _list_in_pages(self._peers, node, directory)

    def _change(self, directory: str, change: _Change) -> None:
        """Apply to the built directory, and log it for a build under way."""
        current = self._dirs.get(directory)
        if current is not None:
            _apply(current.entries, change)
        building = self._building.get(directory)
        if building is not None:
            building.append(change)

    # -- answers ---------------------------------------------------------------

    async def _resolved(self, directory: str, name: str) -> tuple[list[list[Any]], bool, bool]:
        """([node, attr, replica_of] of every holder, complete, pending) for one name.

        Claimed entries get their attributes from their holder here (one message from the
        home, once): a holder without the file yet is "pending" if the claim is recent.
        """
        built = await self._directory(directory)
        holders = dict(built.entries.get(name, {}))
        pending = False
        path = _join(directory, name)
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
                    _apply(current.entries, (name, node, None))  # a create that never happened
                continue
            holders[node] = resolved = _Holder(attr.is_dir, attr, holder.replica_of, holder.since)
            if current is not None and current.entries.get(name, {}).get(node) is holder:
                current.entries[name][node] = resolved
        current = self._dirs.get(directory)
        complete = current is not None and self._complete(directory, current)
        found = [[node, holder.attr, holder.replica_of] for node, holder in holders.items()
                 if holder.attr is not None]
        return found, complete, pending

    def _complete(self, directory: str, built: _Directory) -> bool:
        """Every node was listed -- or, standing in for a home that does not answer, every node but
        that home: its files cannot be reached by anyone now, and misses are then answered
        without a lease (so nobody keeps them)."""
        stand_in = self._backing.get(directory)
        return all(node == stand_in for node in built.missing)

    # -- the homes of subdirectories -------------------------------------------------

    def _backup_node(self, directory: str) -> str | None:
        """This directory's backup, when this node is its home (a stand-in has none to copy to).
        The servers of a split directory's partitions copy to its home's backup: one node keeps
        the homes of all its subdirectories."""
        if self.homes is None or directory in self._backing:
            return None
        parts = self._parts.get(directory)
        backup = self.homes.backup(directory, parts.home if parts is not None else self._peers.me)
        return None if backup == self._peers.me else backup

    async def _settle_homes(self, directory: str, entries: _Entries) -> None:
        """After a build: every subdirectory has a recorded home. Records this node lacks (it
        restarted, or its backup took a mkdir while it was away) come from the backup first;
        the rest follow `Homes.of_holders` and are copied to the backup. Records of names that
        are gone are dropped (and their leases revoked)."""
        if self.homes is None:
            return
        records = self._child_homes.setdefault(directory, {})
        subdirs = {name: holders for name, holders in entries.items()
                   if any(holder.is_dir for holder in holders.values())}
        for name in [name for name in records if name not in subdirs and self._mine(directory, name)]:
            await self._drop_home(directory, name)
        records = self._child_homes.setdefault(directory, {})  # (dropped when it became empty)
        lacking = [name for name in subdirs if name not in records]
        backup = self._backup_node(directory)
        if lacking and backup is not None:
            try:
                theirs = await self._peers.ask(backup, msg.IndexRecords(directory, None), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("backup %s could not give the homes recorded under %s: %s", backup, directory, exc)
            else:
                records = self._child_homes.setdefault(directory, {})
                for name in lacking:
                    if name in theirs and name not in records:
                        records[name] = theirs[name]
        derived = {name: self.homes.of_holders(_join(directory, name), sorted(subdirs[name]))
                   for name in subdirs if name not in records}
        records.update(derived)
        if not records:
            self._child_homes.pop(directory, None)
        if derived:
            await self._copy_records(directory, dict(derived))

    async def _copy_records(self, directory: str, updates: dict[str, str | None], *,
                            seed: str | None = None) -> str | None:
        """Copy `updates` to this directory's backup (with `seed`, see IndexRecords); the backup
        they reached, None when there is none or it did not answer."""
        backup = self._backup_node(directory)
        if backup is None:
            return None
        try:
            await self._peers.ask(backup, msg.IndexRecords(directory, updates, seed), timeout=self.ask_timeout)
        except OSError as exc:
            log.info("could not copy the homes under %s to the backup %s: %s", directory, backup, exc)
            return None
        return backup

    def _child_home(self, directory: str, name: str, holders: Sequence[str]) -> str | None:
        if self.homes is None:
            return None
        records = self._child_homes.setdefault(directory, {})
        if name not in records:  # not built yet (a claim before any build): the rule for found ones
            records[name] = self.homes.of_holders(_join(directory, name), sorted(holders))
        return records[name]

    def _lease_home(self, directory: str, name: str, asker: str | None) -> float:
        if asker is None or self.home_lease <= 0:
            return 0.0
        self._home_leases.setdefault(directory, {}).setdefault(name, {})[str(asker)] = \
            trio.current_time() + self.home_lease
        return self.home_lease

    async def _drop_home(self, directory: str, name: str, *, forgotten_by: str | None = None,
                         index_home: str | None = None, kept: bool = False) -> list[str]:
        """Subdirectory `name` is gone: forget its home; whoever was told it forgets it too (a
        directory made again under that name may be homed elsewhere) -- but `forgotten_by`, the
        node that removed it through its mount, which forgets it itself before and after. Its
        index goes at its home (and at `index_home`, where the remover saw it homed): here, with
        the records copy at the backup, or in one message. `kept`: the remover is the backup and
        drops its copy of the record itself. The homes that did not answer."""
        records = self._child_homes.get(directory)
        home = records.pop(name, None) if records is not None else None
        homes = {node for node in (home, index_home) if node is not None}
        if index_home is not None and index_home == forgotten_by:
            homes.discard(index_home)  # the remover is the home: it forgot the index itself
        if home is None:
            return await self._forget_gone(_join(directory, name), homes)
        if records is not None and not records:
            self._child_homes.pop(directory, None)
        if kept and forgotten_by is not None and self._backup_node(directory) == forgotten_by:
            backup: str | None = forgotten_by
        else:
            backup = await self._copy_records(directory, {name: None})  # the backup forgets its index too
        names = self._home_leases.get(directory)
        leases = names.pop(name, None) if names is not None else None
        if names is not None and not names:
            del self._home_leases[directory]
        await self._tell(leases or {}, msg.IndexUnhome([_join(directory, name)]), but=forgotten_by)
        return await self._forget_gone(_join(directory, name), homes - {backup})

    async def _forget_gone(self, path: str, homes: Collection[str]) -> list[str]:
        """Directory `path` is gone: `homes` drop their index of it; the ones that did not answer."""
        unreached: list[str] = []
        for home in sorted(homes):
            if home == self._peers.me:
                await self.op_forget([path])
                continue
            try:
                await self._peers.ask(home, msg.IndexForget([path]), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not tell %s, the home of %s, that it is gone: %s", home, path, exc)
                unreached.append(home)
        return unreached

    async def op_adopt(self, directory: str, node: str) -> None:
        """`directory` appeared on `node` outside the mount (its parent's home saw it in a sync):
        list it there now -- which also has `node` watch it -- and revoke the "not found"
        handed out for what it holds."""
        if directory not in self._dirs:
            await self._directory(directory)  # a build lists every node, `node` included
            return
        try:
            listing = await self._list(node, directory)
        except OSError as exc:
            log.info("could not list %s on %s: %s", directory, node, exc)
            self.forget([directory])
            return
        await self.op_sync(directory, node, [entry.to_wire() for entry in listing or []])

    async def op_seed(self, directory: str, node: str | None = None) -> None:
        """`directory` was just made by a mkdir through the mount (its name was new everywhere):
        its index starts empty and complete, instead of listing every node at the first lookup.
        Ignored when the index is built already (a create in it came first)."""
        if directory in self._dirs or directory in self._building or directory in self._backing:
            return
        self._dirs[directory] = _Directory({}, trio.current_time(), (), holders={str(node)} if node else set())

    async def op_records(self, directory: str, updates: dict[str, str | None] | None = None,
                         seed: str | None = None) -> dict[str, str]:
        """The copy of a directory's subdirectory homes that its home keeps here, as its backup:
        `updates` applied (None: removed) and nothing returned, or, without `updates`, all of
        them (a home that restarted takes them back) -- a mkdir's copy must not cost a reply
        that grows with the directory. `seed`: the creator of the new subdirectories in
        `updates`; those homed here start empty (op_seed)."""
        records = self._child_homes.setdefault(directory, {})
        for name, home in (updates or {}).items():
            if home is None:
                records.pop(str(name), None)
                self.forget([_join(directory, str(name))])
            else:
                records[str(name)] = str(home)
        if not records:
            self._child_homes.pop(directory, None)
        if seed is not None:
            for name, home in (updates or {}).items():
                if home == self._peers.me:
                    await self.op_seed(_join(directory, str(name)), str(seed))
        return {} if updates else dict(self._child_homes.get(directory, {}))

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
            gone = current is not None and not any(h.is_dir for h in current.entries.get(name, {}).values())
            if gone and (name in self._child_homes.get(directory, {}) or index_home is not None):
                unreached += await self._drop_home(directory, name, forgotten_by=forgotten_by, index_home=index_home,
                                                   kept=kept)
        leases = self._listing_leases.pop(directory, None)
        if leases:
            kept_lease = leases.get(but) if but is not None else None
            if kept_lease is not None and kept_lease > trio.current_time():
                # the node that made the change applies it to its listing itself (IndexLocator.change)
                self._listing_leases.setdefault(directory, {})[str(but)] = kept_lease
            await self._tell(leases, msg.IndexUnlist(directory), but=but)
        return unreached

    async def op_lookup(self, directory: str, name: str, asker: str | None = None,
                        with_listing: bool = False) -> dict[str, Any]:
        """Every holder of `name` in `directory`. A definite "none" to `asker` is leased to it:
        the reply's `lease` is how long this home will revoke it (tell `asker` of a create).
        A subdirectory comes with its `home`, leased for `home_lease` seconds (revoked when the
        subdirectory goes). `with_listing`: the whole directory comes too, as `index_list` gives
        it (not for a split directory, whose other partitions are elsewhere)."""
        self._lookups += 1
        backing = self._serving_as_backup(directory)
        holders, complete, pending = await self._resolved(directory, name)
        if not holders and complete and not pending and self.verify_misses:
            holders = await self._verify_absent(directory, name, None if asker is None else str(asker))
        lease = 0.0
        if not holders and complete and not pending and asker is not None and self.lease > 0 and not backing:
            names = self._negatives.setdefault(directory, {})
            names.setdefault(name, {})[str(asker)] = trio.current_time() + self.lease
            self._leased += 1
            lease = self.lease
        home, home_lease = None, 0.0
        if any(attr.is_dir for _, attr, _ in holders):
            home = self._child_home(directory, name, [str(node) for node, _, _ in holders])
            home_lease = self._lease_home(directory, name, asker) if home is not None else 0.0
        current = self._dirs.get(directory)
        parts = self._bitmap(directory)
        listing = await self.op_list(directory, asker) if with_listing and not parts else None
        return {"holders": holders, "complete": complete, "pending": pending, "lease": lease,
                "home": home, "home_lease": home_lease, "parts": parts,
                "size": None if current is None else len(current.entries), "listing": listing}

    async def op_list(self, directory: str, asker: str | None = None) -> dict[str, Any]:
        """The whole directory in one reply: [name, [[node, attr, replica_of], ...], home] for each
        name. Complete: leased to `asker` for `listing_lease` seconds (any change revokes it)."""
        self._listings += 1
        backing = self._serving_as_backup(directory)
        built = await self._directory(directory)
        asked: dict[str, list[list[Any]]] = {}  # claimed or renamed names: their holders are asked, at once
        limiter = trio.CapacityLimiter(_RESOLVE_AT_ONCE)

        async def resolve(name: str) -> None:
            async with limiter:
                asked[name] = (await self._resolved(directory, name))[0]

        async with open_nursery() as nursery:
            for name, holders in list(built.entries.items()):
                if any(holder.attr is None for holder in holders.values()):
                    nursery.start_soon(resolve, name)
        rows: list[list[Any]] = []
        for name, holders in list(built.entries.items()):
            found = asked.get(name)
            if found is None:
                found = [[node, holder.attr, holder.replica_of] for node, holder in holders.items()
                         if holder.attr is not None]  # (claimed since: not listed yet)
            if not found:
                continue
            home = None
            if any(attr.is_dir for _, attr, _ in found):
                home = self._child_home(directory, name, [str(node) for node, _, _ in found])
                if home is not None:
                    self._lease_home(directory, name, asker)
            rows.append([name, found, home])
        current = self._dirs.get(directory, built)
        complete = self._complete(directory, current)
        if len(rows) > _PAGE:
            raise OSError(errno.EFBIG, f"{directory} has {len(rows)} entries: list it from every node in pages")
        lease = 0.0
        if complete and asker is not None and self.listing_lease > 0 and not backing:
            self._listing_leases.setdefault(directory, {})[str(asker)] = trio.current_time() + self.listing_lease
            lease = self.listing_lease
        return {"entries": rows, "complete": complete, "exists": current.exists or bool(rows), "lease": lease,
                "home_lease": self.home_lease if asker is not None else 0.0, "parts": self._bitmap(directory)}

    async def op_backup(self, home: str, op: str, args: list[Any]) -> Any:
        """Serve `op` for `home`, which did not answer the asker: this node stands in for it (the
        backup, at the same site). The directory is listed from the exports again (soft state),
        every create is told to every node (the leases `home` handed out died with it), and
        no "not found" or listing is leased."""
        if op not in _BACKED_OPS:
            raise OSError(errno.EINVAL, f"node {self._peers.me} does not serve {op!r} as a backup")
        if args and str(args[0]) in self._parts:
            raise OSError(errno.EHOSTDOWN, f"node {self._peers.me} serves partitions of the split directory "
                                           f"{args[0]}: it cannot stand in for its home {home}")
        self._taken_over += 1
        token = _AS_BACKUP.set(str(home))
        try:
            return await self.operations()[op](*args)
        finally:
            _AS_BACKUP.reset(token)

    def _serving_as_backup(self, directory: str) -> bool:
        """Whether this request is served for a home that did not answer (a normal request for the
        directory means this node is its home again: it leaves the stand-in mode)."""
        stand_in = _AS_BACKUP.get()
        if stand_in is None:
            if self._backing.pop(directory, None) is not None:
                self._dirs.pop(directory, None)  # built as a stand-in: not trusted as the home's own
            return False
        if self._backing.get(directory) != stand_in:
            self._backing[directory] = stand_in
            self._dirs.pop(directory, None)  # taking over: list it from the exports now
        return True

    # -- Giga+ partitions ------------------------------------------------------------

    def _server_of(self, directory: str, parts: _Parts, partition: int) -> str:
        if partition == 0 or self.homes is None:
            return parts.home
        return self.homes.of_partition(directory, partition)

    def _served_here(self, directory: str, parts: _Parts) -> list[int]:
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

    def _gated(self, op: str, serve: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """`serve`, waiting while a partition of the directory splits here; a name this node does
        not serve (any more) is refused with the partitions it knows of (_Misdirected). It keeps
        `serve`'s signature (tests/test_messages.py matches it with the op's request type)."""
        @functools.wraps(serve)
        async def gated(directory: str, *args: Any) -> Any:
            directory = str(directory)
            while (closed := self._closed.get(directory)) is not None:
                await closed.wait()
            self._active[directory] += 1
            try:
                if op in _NAME_OPS and not self._mine(directory, str(args[0])):
                    self._redirects += 1
                    raise _Misdirected(directory, str(args[0]), self._peers.me, self._parts[directory].bitmap)
                result = await serve(directory, *args)
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

    async def op_part(self, partition: int, home: str, bitmap: list[int], op: str, args: list[Any]) -> list[Any]:
        """`op` for a split directory, from an asker that maps the name to `partition` of this node
        with the partitions `bitmap` (and the directory's `home`). Answers ["ok", result, bitmap]
        or, for a name another node serves, ["redirect", bitmap]: the asker merges the bitmap
        and asks again (Giga+'s correction of a stale mapping, a hop per stale level)."""
        if op not in _PART_OPS:
            raise OSError(errno.EINVAL, f"node {self._peers.me} does not serve {op!r} for a partition")
        directory = str(args[0])
        await self._learn(directory, str(home), bitmap)
        try:
            result = await self.operations()[op](*args)
        except _Misdirected as exc:
            return ["redirect", exc.bitmap]
        return ["ok", result, self._bitmap(directory) or [0]]

    async def op_parts(self, directory: str, home: str, bitmap: list[int]) -> None:
        """A server of a partition of `directory` split it: the home learns the new partition (so
        its redirects send askers straight there, and it passes changes on to it)."""
        await self._learn(str(directory), str(home), bitmap)

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
            parts = _Parts(home, {0})
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
        for name in [name for name in self._negatives.get(directory, {}) if not self._mine(directory, name)]:
            await self._revoke(directory, name, False, but=None)
        leases = self._listing_leases.pop(directory, None)
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
                parts = self._parts.get(directory) or _Parts(self._peers.me, {0})
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

    async def _split(self, directory: str, built: _Directory, parts: _Parts, new: int) -> None:
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
        negatives = self._negatives.get(directory, {})
        leased = {name: negatives.pop(name) for name in [n for n in negatives if not self._mine(directory, n)]}
        if directory in self._negatives and not negatives:
            del self._negatives[directory]
        records = self._child_homes.get(directory, {})
        home_leases = self._home_leases.get(directory, {})
        payload: msg.SplitPayload = {
            "home": parts.home, "bitmap": sorted(parts.bitmap), "partition": new,
            "entries": [[name, node, holder.is_dir, holder.attr, holder.replica_of,
                         None if holder.since is None else now - holder.since]
                        for name, holders in moved.items() for node, holder in holders.items()],
            "missing": list(built.missing), "exists": built.exists, "holders": sorted(built.holders),
            "negatives": {name: {node: until - now for node, until in askers.items() if until > now}
                          for name, askers in leased.items()},
            "listing_leases": {node: until - now for node, until in self._listing_leases.get(directory, {}).items()
                               if until > now},
            "child_homes": {name: records[name] for name in moved if name in records},
            "home_leases": {name: {node: until - now for node, until in home_leases[name].items() if until > now}
                            for name in moved if name in home_leases},
        }
        try:
            await self._peers.ask(target, msg.IndexSplit(directory, payload), timeout=self.ask_timeout)
        except OSError as exc:
            # the new server lists the partition from the exports when first asked; what only this
            # node knew goes: whoever was told "not found" for those names is told to ask again
            log.info("could not hand partition %d of %s to %s: %s", new, directory, target, exc)
            for name, askers in leased.items():
                await self._tell({node: float("inf") for node in askers}, msg.Created(_join(directory, name), False),
                                 but=None)
        if parts.home != self._peers.me:
            try:
                await self._peers.ask(parts.home, msg.IndexParts(directory, parts.home, sorted(parts.bitmap)),
                                      timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not tell %s, the home of %s, of its partition %d: %s", parts.home, directory, new, exc)

    async def op_split(self, directory: str, payload: dict[str, Any]) -> None:
        """Become the server of a partition another node split off (`_split`): its names, claims
        and leases. A partition this node serves already (it learnt of it from an asker and
        listed it from the exports) keeps its own names; the leases are merged in."""
        directory = str(directory)
        now = trio.current_time()
        parts = self._parts.get(directory)
        partition = int(payload["partition"])
        fresh = parts is None or partition not in parts.bitmap
        served_before = [] if parts is None else self._served_here(directory, parts)
        if parts is None:
            parts = self._parts[directory] = _Parts(str(payload["home"]), {0})
        parts.bitmap |= {int(p) for p in payload["bitmap"]}
        if fresh:
            changes: list[_Change] = []
            for name, node, is_dir, attr, replica_of, age in payload["entries"]:
                value = None if attr is None else Attr.from_wire(attr)
                changes.append((str(name), str(node), _Holder(bool(is_dir), value,
                                                              None if replica_of is None else str(replica_of),
                                                              None if age is None else now - float(age))))
            if directory in self._dirs or directory in self._building:
                for change in changes:
                    self._change(directory, change)
            elif not served_before:  # nothing else of it here: the partition is the whole index
                entries: _Entries = {}
                for change in changes:
                    _apply(entries, change)
                self._dirs[directory] = _Directory(entries, now, tuple(payload["missing"]), bool(payload["exists"]),
                                                   {str(node) for node in payload["holders"]})
            # else: other partitions here are not built: the next request lists them all
        negatives = self._negatives.setdefault(directory, {})
        for name, askers in payload["negatives"].items():
            for node, left in askers.items():
                negatives.setdefault(str(name), {})[str(node)] = now + float(left)
        if not negatives:
            del self._negatives[directory]
        if payload["listing_leases"]:
            listing = self._listing_leases.setdefault(directory, {})
            for node, left in payload["listing_leases"].items():
                listing[str(node)] = max(listing.get(str(node), 0.0), now + float(left))
        if payload["child_homes"]:
            self._child_homes.setdefault(directory, {}).update(
                {str(name): str(home) for name, home in payload["child_homes"].items()})
        for name, askers in payload["home_leases"].items():
            leases = self._home_leases.setdefault(directory, {}).setdefault(str(name), {})
            leases.update({str(node): now + float(left) for node, left in askers.items()})

    async def _pass_on(self, directory: str, parts: _Parts, change: msg.IndexSync | msg.IndexForget,
                       covered: list[int] | None) -> None:
        """Send `change` (its `covered`: this node's bitmap) to the servers of the partitions this
        node knows of and the sender did not (`covered`, the sender's bitmap): from the home to
        every partition it knows, and from the server of a partition to the ones it split off and
        has not told the home of yet."""
        skip = {int(p) for p in covered or ()}
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

    async def op_claim(self, directory: str, name: str, node: str, is_dir: bool = False,
                       exclusive: bool = True) -> list[Any]:
        """`node` is about to create `name`: [the existing holders, False, False] if there are
        any (nothing is claimed then), else [[], seeded, keep] (IndexClaimReply) -- the name is
        recorded for `node` and every node holding a "not found" for it has been told before
        this returns.

        `exclusive` False (a parent directory a create makes on `node`): a directory merges
        with the directories of that name elsewhere, so it is always recorded.
        A new directory is homed at `node`'s site (`Homes.of_creator`), recorded here and on
        this directory's backup (one intra-site message) before this returns -- or by `node`
        itself when it is that backup (`keep`: the copy needs no message). When that home is
        this node or the backup, its index is started empty here or with the copy (`seeded`):
        the creator's mkdir saves the round trip of the seed.
        """
        backing = self._serving_as_backup(directory)
        holders, _, pending = await self._resolved(directory, name)
        others = [h for h in holders if h[0] != node]
        if exclusive and not others and not pending and self.verify_misses:
            others = await self._verify_absent(directory, name, str(node))
        built = self._dirs.get(directory)
        if built is not None:
            built.holders.add(str(node))  # a create there makes the directory on `node` (if it lacked it)
        if exclusive and (others or pending):
            if not others:
                raise OSError(errno.EAGAIN, f"{_join(directory, name)} is being created on another node; "
                                            "try again")
            return [others, False, False]
        self._change(directory, (name, node, _Holder(bool(is_dir), None, None, trio.current_time())))
        seeded = keep = False
        if is_dir and self.homes is not None:
            records = self._child_homes.setdefault(directory, {})
            if not holders or name not in records:  # a new name: homed at its creator's site
                home = records[name] = self.homes.of_creator(_join(directory, name), str(node))
                seed = str(node) if not holders and not pending else None  # new everywhere: it starts empty
                if seed is not None and home == self._peers.me:
                    await self.op_seed(_join(directory, name), seed)
                    seeded = True
                if self._backup_node(directory) == node:
                    keep = True  # the claimant copies it to itself
                    seeded = seeded or (seed is not None and home == node)
                else:
                    reached = await self._copy_records(directory, {name: home}, seed=seed)
                    seeded = seeded or (seed is not None and reached == home)
            self._lease_home(directory, name, node)
        await self._revoke(directory, name, bool(is_dir), but=node, everyone=backing)
        await self._changed(directory, [name], but=node)
        return [[], seeded, keep]

    async def _verify_absent(self, directory: str, name: str, asker: str | None) -> list[list[Any]]:
        """Ask the nodes holding `directory` (but the asker, which looked in its own export) for
        `name`: what they hold is recorded (as a scan would) and returned."""
        built = self._dirs.get(directory)
        path = _join(directory, name)
        found: list[list[Any]] = []

        async def ask(node: str) -> None:
            try:
                attr = await self._peers.ask(node, msg.Lookup(path), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not ask %s whether it holds %s: %s", node, path, exc)
                return
            if attr is not None:
                self._change(directory, (name, node, _Holder(attr.is_dir, attr)))
                found.append([node, attr, None])

        async with open_nursery() as nursery:
            for node in sorted(built.holders if built is not None else ()):
                if node != asker and not self._peers.is_down(node):
                    nursery.start_soon(ask, node)
        return found

    async def op_set(self, directory: str, name: str, node: str, attr: Any, replica_of: str | None = None,
                     is_dir: bool = False, asker: str | None = None) -> None:
        """`node` holds `name` with these attributes (None: ask it) -- after a write, a put, a staging.
        `asker` (default `node`), the node that made the change, keeps its listing (see `_changed`)."""
        backing = self._serving_as_backup(directory)
        if backing:  # a stand-in tells every node of a name new to it (a put), not of a close
            built = await self._directory(directory)
            backing = not built.entries.get(name)
        value = None if attr is None else Attr.from_wire(attr)
        holder = _Holder(value.is_dir if value is not None else bool(is_dir), value,
                         None if replica_of is None else str(replica_of), trio.current_time())
        self._change(directory, (name, node, holder))
        await self._revoke(directory, name, holder.is_dir, but=node, everyone=backing)
        await self._changed(directory, [name], but=node if asker is None else str(asker))

    async def op_drop(self, directory: str, name: str, nodes: list[str] | None = None,
                      asker: str | None = None, index_home: str | None = None, keep: bool = False) -> list[str]:
        """`name` is gone from `nodes` (None: from every node). `asker`, the node that removed it,
        keeps its listing and forgets a removed directory's home itself (IndexLocator's
        announce_removed and announce_renamed): a revocation there would cost the removal a
        round trip. A removed directory's index is forgotten at its home and `index_home`, and
        `keep` has the asker, the backup, drop its copy of its record itself (see `_drop_home`);
        the homes that did not answer."""
        self._serving_as_backup(directory)
        asker = None if asker is None else str(asker)
        index_home = None if index_home is None else str(index_home)
        unreached: list[str] = []
        if nodes is None:
            self._change(directory, (name, None, None))
            unreached += await self._drop_home(directory, name, forgotten_by=asker, index_home=index_home,
                                               kept=bool(keep))
            index_home = None
        else:
            for node in nodes:
                self._change(directory, (name, str(node), None))
        return unreached + await self._changed(directory, [name], but=asker, forgotten_by=asker,
                                               index_home=index_home, kept=bool(keep))

    async def op_replace(self, directory: str, name: str, nodes: list[str], is_dir: bool,
                         asker: str | None = None) -> None:
        """After a rename to `name`: exactly `nodes` hold it now (their attributes are asked later).
        A directory renamed here is homed by `Homes.of_holders` (its old home's records are gone
        with its old path). `asker`, the renaming node, is not told "created": its kernel moved
        the entry itself, and it holds that directory's lock until this returns (an
        invalidation there would wait for KERNEL_NOTIFY_WAIT: 0.5 s per rename)."""
        backing = self._serving_as_backup(directory)
        self._change(directory, (name, None, None))
        await self._drop_home(directory, name)
        now = trio.current_time()
        for node in nodes:
            self._change(directory, (name, str(node), _Holder(bool(is_dir), None, None, now, renamed=True)))
        if is_dir and self.homes is not None:
            home = self._child_home(directory, name, [str(node) for node in nodes])
            await self._copy_records(directory, {name: home})
        await self._revoke(directory, name, bool(is_dir), but=asker, everyone=backing)
        await self._changed(directory, [name], but=asker)

    async def op_rename(self, directory: str, name: str, src: str, nodes: list[str], is_dir: bool,
                        asker: str | None = None) -> None:
        """A rename within `directory`: op_drop of `src`, then op_replace of `name`, in one message.
        EXDEV when this node does not serve `src` too (the two names are in partitions of a split
        directory that different nodes serve): the asker sends the two messages instead."""
        if not self._mine(directory, str(src)):
            raise OSError(errno.EXDEV, f"node {self._peers.me} does not serve both {src!r} and {name!r} of the "
                                       f"split directory {directory}")
        await self.op_drop(directory, src, None, asker)
        await self.op_replace(directory, name, nodes, is_dir, asker)

    async def op_sync(self, directory: str, node: str, changes: list[Any], covered: list[int] | None = None) -> None:
        """`node`'s export changed outside the mount (or its scan saw the mount's own changes):
        these entries of `directory` are new or changed there, and those with no attributes
        (`[name, None]`) are gone from it.

        Names new to the directory revoke the "not found" handed out for them, like a create.
        A split directory's changes go on to the servers of the partitions this node knows of
        and the sender did not (`covered`); each keeps the names of its own partitions.
        """
        parts = self._parts.get(directory)
        if parts is not None:
            await self._pass_on(directory, parts, msg.IndexSync(directory, node, changes, sorted(parts.bitmap)),
                                covered)
            changes = [entry for entry in changes if self._mine(directory, str(entry[0]))]
        current = self._dirs.get(directory)
        if current is None and directory not in self._building:
            return  # not built: the next build lists it anyway
        # Under a build, the changes are logged for it (`_change`) and applied after its listings,
        # as a claim's are: a directory that changes every second while it takes longer than that
        # to list would never be kept if its build were thrown away instead.
        entries = current.entries if current is not None else {}
        now = trio.current_time()
        seen: dict[str, _Holder] = {}
        gone: list[str] = []
        for entry in changes:
            if entry[1] is None:
                gone.append(str(entry[0]))
                continue
            attr = Attr.from_wire(entry[1])
            seen[str(entry[0])] = _Holder(attr.is_dir, attr, str(entry[2]) if len(entry) > 2 else None)
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
                if before.attr is not None:
                    continue
                holder = _Holder(holder.is_dir, holder.attr, holder.replica_of, before.since)
            # a rename's attributes, not known here till now: every listing handed out since asked the holder
            filled = before is not None and before.renamed and before.attr is None
            if name not in new_names and not filled and not _same_but_atime(before, holder):
                changed.append(name)
            self._change(directory, (name, node, holder))
        for name in new_names:
            await self._revoke(directory, name, seen[name].is_dir, but=None)
        if changed:  # a scan that found nothing new (the mount's own creates, told already) revokes nothing
            await self._changed(directory, changed, but=None)
        for name in appeared:
            child, home = _join(directory, name), self._child_homes[directory][name]
            try:
                await self._peers.ask(home, msg.IndexAdopt(child, node), timeout=self.ask_timeout)
            except OSError as exc:
                log.info("could not tell %s, the home of %s, that it appeared on %s: %s", home, child, node, exc)

    async def op_forget(self, prefixes: list[str], covered: list[int] | None = None) -> None:
        """Directories under `prefixes` changed wholesale (renamed, removed, or a change failed
        half-way): build their indexes again from the exports when next asked. The servers of
        the partitions of split directories among them do the same."""
        prefixes = [str(prefix) for prefix in prefixes]
        self.forget(prefixes)
        under = _under_any(prefixes)
        for directory, parts in list(self._parts.items()):
            if under(directory):
                await self._pass_on(directory, parts, msg.IndexForget([directory], sorted(parts.bitmap)), covered)

    def forget(self, prefixes: list[str]) -> None:
        under = _under_any([str(prefix) for prefix in prefixes])
        for directory in [d for d in self._dirs if under(d)]:
            del self._dirs[directory]
        for directory in self._building:
            if under(directory):
                self._outdated.add(directory)  # its listings under way may predate the change

    async def _revoke(self, directory: str, name: str, is_dir: bool, *, but: str | None,
                      everyone: bool = False) -> None:
        """Tell every node holding an unexpired "not found" for the name that it exists now.
        `everyone`: a stand-in for a dead home, which does not know whom that home told:
        every node is told."""
        names = self._negatives.get(directory)
        leases = names.pop(name, None) if names is not None else None
        if names is not None and not names:
            del self._negatives[directory]
        if everyone:
            leases = {node: float("inf") for node in self.order if node != self._peers.me}
        if not leases:
            return
        await self._tell(leases, msg.Created(_join(directory, name), is_dir), but=but)


def _same_but_atime(before: _Holder | None, after: _Holder) -> bool:
    """Would a listing show the same for this holder? (A read moves atime; that is no change.)"""
    if before is None or before.attr is None or after.attr is None or before.replica_of != after.replica_of:
        return before is not None and before.attr is None and after.attr is None
    return before.attr._replace(atime_ns=0) == after.attr._replace(atime_ns=0)


def _apply(entries: _Entries, change: _Change) -> None:
    name, node, holder = change
    if not name:
        return
    if node is None:
        entries.pop(name, None)
        return
    if holder is None:
        holders = entries.get(name)
        if holders is not None:
            holders.pop(node, None)
            if not holders:
                del entries[name]
        return
    entries.setdefault(name, {})[node] = holder


# -- a node's own export, watched for changes made outside the mount ------------------------------


class ExportWatcher:
    """Tells homes of entries that appear in (or vanish from) this node's export outside the mount.

    A home lists a directory from every node through `index_listdir`, which also
    starts watching that directory here. `scan()` (every second, from the daemon)
    compares each watched directory's mtime with the one seen at its last listing;
    a directory that changed is listed again here and only what differs from what
    its home was last told (names added or changed, names gone) is sent
    (`index_sync`): one message per changed directory per scan, whatever changed
    it -- the mount's own creates included, which the home knows already and
    keeps. Sending the difference keeps a directory that grows by many creates
    from costing its whole listing every second. So files copied straight into an
    export are seen by every node within about a second, with the hand-off rule 1
    revocations. A changed *file* (same name, new size) does not change its
    directory's mtime: its size is corrected by the next write through the mount,
    an open (which asks the holder), or the home's rescan.
    """

    def __init__(self, peers: Peers, homes: Homes, *, max_directories: int = 10_000) -> None:
        self._peers = peers
        self.homes = homes
        self._max = max_directories
        self._seen: OrderedDict[str, int | None] = OrderedDict()  # directory -> mtime_ns at the last listing
        self._asked_by: dict[str, str] = {}  # directory -> the home that listed it last
        self._told: dict[str, dict[str, _Told]] = {}  # directory -> name -> what its home was told of it
        self._scanning = trio.Lock()  # the daemon's scan every second, and `rescan` asked for
        self.syncs = 0

    def operations(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {"index_listdir": self.op_listdir, "rescan": self.scan}

    async def _mtime(self, directory: str) -> int | None:
        try:
            attr = await self._peers.ask(self._peers.me, msg.Lookup(directory))
        except OSError:
            return None
        return None if attr is None else attr.mtime_ns

    async def op_listdir(self, directory: str, home: str | None = None) -> list[Any] | None:
        """This node's listing of `directory` for its home, which is watched from now on (EFBIG
        when it needs paging: the home pages through it, and it is watched all the same).
        Changes go to `home`, the node that asked (homes other than the root's are not computable)."""
        mtime = await self._mtime(directory)  # before listing: a change meanwhile shows at the next scan
        request = msg.Listdir(directory)
        try:
            # the reply as the service gave it, passed on untouched (a node's own call: no socket)
            listing: list[Any] | None = await self._peers.call(self._peers.me, request.op, *request.args())
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            self._watch(directory, mtime, await _list_whole(self._peers, self._peers.me, directory), home)
            raise
        self._watch(directory, mtime, request.decode(listing), home)
        return listing

    def _watch(self, directory: str, mtime: int | None, listing: list[DirEntry] | None, home: str | None) -> None:
        """Watch `directory` from here on: its home was told `listing`, as of `mtime`."""
        self._seen[directory] = mtime
        self._seen.move_to_end(directory)
        self._told[directory] = _told(listing or [])
        if home is not None:
            self._asked_by[directory] = str(home)
        if len(self._seen) > self._max:
            dropped, _ = self._seen.popitem(last=False)
            self._asked_by.pop(dropped, None)
            self._told.pop(dropped, None)

    async def scan(self) -> int:
        """Send what changed in every watched directory whose mtime changed; returns how many were sent.
        Also the `rescan` request: a user who copied files into the export need not wait a second."""
        async with self._scanning:
            return await self._scan()

    async def _scan(self) -> int:
        sent = 0
        for directory, seen in list(self._seen.items()):
            mtime = await self._mtime(directory)
            if mtime == seen:
                continue
            home = self._asked_by.get(directory) or self.homes.home(directory)
            try:
                listing = [] if mtime is None else await _list_whole(self._peers, self._peers.me, directory)
            except OSError as exc:
                log.info("cannot list %s to tell its home of a change: %s", directory, exc)
                continue
            listed = _told(listing or [])
            before = self._told.get(directory, {})
            changes = ([entry.to_wire() for entry in listing or [] if before.get(entry.name) != listed[entry.name]]
                       + [[name, None] for name in before if name not in listed])
            if changes:
                try:
                    await self._peers.ask(home, msg.IndexSync(directory, self._peers.me, changes))
                except OSError as exc:
                    log.info("could not tell home %s of changes in %s: %s", home, directory, exc)
                    continue  # tried again at the next scan
                sent += 1
                self.syncs += 1
            if mtime is None or listing is None:  # gone from this export: no longer watched
                self._seen.pop(directory, None)
                self._asked_by.pop(directory, None)
                self._told.pop(directory, None)
            elif directory in self._seen:
                self._seen[directory] = mtime
                self._told[directory] = listed
        return sent


async def _list_whole(peers: Peers, node: str, directory: str) -> list[DirEntry] | None:
    """`node`'s entries of `directory` (None: it has no such directory), in pages when too many
    for one reply."""
    try:
        return await peers.ask(node, msg.Listdir(directory))
    except OSError as exc:
        if exc.errno != errno.EFBIG:
            raise
    return await _list_in_pages(peers, node, directory)


async def _list_in_pages(peers: Peers, node: str, directory: str) -> list[DirEntry] | None:
    opened = await peers.ask(node, msg.Opendir(directory))
    if opened is None:
        return None
    entries: list[DirEntry] = []
    try:
        while len(entries) < opened.count:
            page = await peers.ask(node, msg.Readdir(opened.handle, len(entries), _PAGE))
            if not page:
                break
            entries.extend(page)
    finally:
        await peers.ask(node, msg.Closedir(opened.handle))
    return entries


#: What a watcher told a home of one entry: its attributes but the access time, and the
#: source node when it is a staged replica.
_Told = tuple[tuple[int, ...], str | None]


def _told(listing: list[DirEntry]) -> dict[str, _Told]:
    result: dict[str, _Told] = {}
    for entry in listing:
        attr = entry.attr
        result[entry.name] = (attr[:5] + attr[6:], entry.replica_of)
    return result


# -- the asking side ------------------------------------------------------------------------------


class _Flight:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Location | None = None
        self.finished = False
        self.stale = False


@dataclass
class _Listing:
    """A directory's listing from its home, kept while the home's lease lasts (`until`): each name
    with every holder as the home has it. The home revokes it when another node changes the
    directory; a change this node makes there it applies itself (IndexLocator.change), so a job
    working through its own directory keeps answering lookups from its listing. `unsure`: names
    renamed here, whose attributes only their holder knows now: looked up at the home, and
    no readdir from this listing while there are any."""

    rows: dict[str, tuple[IndexHolder, ...]]
    until: float
    unsure: set[str] = field(default_factory=set)

    def set_attr(self, name: str, node: str, attr: Attr) -> bool:
        """`node`'s file `name` has `attr` now; False when this listing did not show it there."""
        holders = self.rows.get(name)
        if holders is None or name in self.unsure or all(h.node != node or h.replica_of for h in holders):
            return False
        self.rows[name] = tuple(h._replace(attr=attr) if h.node == node and not h.replica_of else h
                                for h in holders)
        return True

    def remove(self, name: str, node: str) -> bool:
        """`node`'s file `name` is gone; False when this listing did not show it there."""
        holders = self.rows.get(name)
        if holders is None or all(h.node != node for h in holders):
            return False
        left = tuple(h for h in holders if h.node != node)
        if left:
            self.rows[name] = left
        else:
            del self.rows[name]
            self.unsure.discard(name)
        return True

    def take(self, name: str) -> tuple[IndexHolder, ...] | None:
        """A rename's source: the name goes with every holder (as its home drops it)."""
        self.unsure.discard(name)
        return self.rows.pop(name, None)

    def put(self, name: str, holders: tuple[IndexHolder, ...]) -> None:
        """A rename's target: exactly these holders now, their attributes not known here."""
        self.rows[name] = holders
        self.unsure.add(name)


class _Home(NamedTuple):
    """What this node knows of a directory's home: the node (None: the directory does not exist
    as a directory), and until when that stays true (a lease; 0: not leased). `definite` False:
    the parent's home could not tell (the name is being created, or not every node was listed)."""

    node: str | None
    until: float
    definite: bool = True


class IndexLocator:
    """Locator that asks the home of a path's directory: own export, caches, then one node.

    `negative_ttl` is how long the FUSE layer lets the kernel keep a "not found";
    a cached negative is used only while the home's lease outlives that, so a
    create's revocation always reaches every node that may still answer "not found".

    Where a directory's home is: the root's by hashing (`Homes.home`); any other
    directory's home is told by its parent's home with the lookup of the directory
    (or with the parent's listing) and kept for `home_lease` seconds, revoked by
    that parent's home when the directory goes (`index_unhome`). So once the
    kernel has looked a directory up -- it always has before it asks for a name in
    it -- a lookup in it is one round trip to one node. When the home does not
    answer, its backup (same site) is asked instead (`index_backup`); only when
    neither answers does a lookup ask every node.
    """

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
        self._positive: OrderedDict[str, tuple[Location, float]] = OrderedDict()
        self._negative: OrderedDict[str, float] = OrderedDict()  # path -> lease expiry (conservative)
        self._homes: OrderedDict[str, tuple[str, float]] = OrderedDict()  # directory -> (home, lease expiry)
        self._listings: dict[str, _Listing] = {}  # readdir's, or listed ahead
        self._own_changes: dict[str, list[int]] = {}  # directory -> [changes begun here, those under way]
        self._streaks: OrderedDict[str, int] = OrderedDict()  # directory -> names found there through its home
        self._unlisted: OrderedDict[str, float] = OrderedDict()  # directory -> when a listing went early
        self._revoked = 0  # counts revocations of homes and listings: an answer older than one is not kept
        self._inflight: dict[str, _Flight] = {}
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

    def operations(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The revocations homes send to this node, for NodeService's `extra` table."""
        return {"index_unhome": self.op_unhome, "index_unlist": self.op_unlist, "recorded": self.op_recorded}

    async def op_unhome(self, prefixes: list[str], indexes: bool = False) -> None:
        """The directories under `prefixes` are gone or moved: forget their homes, listings and the
        "not found" under them (a directory made again there may be homed elsewhere).
        `indexes`: this node's own index of them goes too (a directory rename)."""
        self._forget_homes([str(prefix) for prefix in prefixes])
        if indexes and self.index is not None:
            self.index.forget([str(prefix) for prefix in prefixes])

    async def op_unlist(self, directory: str) -> None:
        """The listing of `directory` handed out by its home changed."""
        self._revoked += 1
        self._drop_listing(str(directory))

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
        self._unlisted[directory] = trio.current_time()
        self._unlisted.move_to_end(directory)
        if len(self._unlisted) > LIST_AHEAD_KEPT:
            self._unlisted.popitem(last=False)

    def _forget_homes(self, prefixes: list[str]) -> None:
        self._revoked += 1
        under = _under_any(prefixes)
        for cache in (self._homes, self._listings, self._negative, self._parts):
            for key in [k for k in cache if under(k)]:
                del cache[key]
        for prefix in prefixes:
            self._mark_stale(prefix)

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
        for _ in range(_MAX_HOPS):
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
                                                                 f"{request.name!r} after {_MAX_HOPS} hops")

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

    async def _home_of(self, directory: str) -> _Home:
        if directory == "/" or self.homes.central is not None:
            return _Home(self.homes.home(directory), float("inf"))
        now = trio.current_time()
        cached = self._homes.get(directory)
        if cached is not None and cached[1] > now:
            return _Home(*cached)
        parent, name = split_parent(directory)
        revoked = self._revoked
        reply = await self._dir_call(parent, msg.IndexLookup(parent, name, self._peers.me))
        self._note_home(directory, reply.home, reply.home_lease, now, revoked)
        if reply.home is not None:
            return _Home(reply.home, now + reply.home_lease)
        if reply.pending or not reply.complete:
            return _Home(None, 0.0, definite=False)
        if reply.holders:
            return _Home(None, 0.0)  # a file: nothing is in it, but that is not leased
        # no such directory, for as long as the parent's home leases that "not found" (and its
        # parent's home lease, if any: the "not found" came from that home)
        return _Home(None, min(now + reply.lease, self._home_expiry(parent)))

    def _note_home(self, directory: str, home: str | None, lease: float, sent: float, revoked: int) -> None:
        """Keep `directory`'s home, leased for `lease` seconds from `sent` (unless a revocation came
        since the answer was asked for: `revoked` as it was then)."""
        if home is None or lease <= 0 or revoked != self._revoked:
            return
        self._homes[directory] = (home, sent + lease)
        self._homes.move_to_end(directory)
        # kept a lease longer than it lasts: a change its home missed is owed to the last one known
        drop_expired(self._homes, lambda cached: cached[1] + self.home_lease, trio.current_time())
        if len(self._homes) > self._max:
            self._homes.popitem(last=False)

    def _home_expiry(self, directory: str) -> float:
        if directory == "/" or self.homes.central is not None:
            return float("inf")
        cached = self._homes.get(directory)
        return cached[1] if cached is not None else 0.0

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
        cached = self._homes.get(directory)
        if cached is not None:
            self._owe(cached[0], directory)

    async def flush_owed(self) -> None:
        """Tell the homes that missed changes to list those directories again (the daemon calls
        this every second; a home that is still unreachable stays owed)."""
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

    async def _local(self, path: str) -> Location | None:
        """This node's own export (no message): the file itself, or a still-valid staged replica."""
        reply = await self._peers.ask(self._peers.me, msg.Locate(path))
        if reply is None:
            return None
        if reply.replica is None:
            return Location(self._peers.me, reply.attr)
        if await self._flood._replica_still_valid(path, reply.replica):
            return Location(self._peers.me, reply.attr, replica_of=reply.replica.node)
        return None

    # -- finding -------------------------------------------------------------------

    async def find(self, path: str, *, fresh: bool = False) -> Location | None:
        """The nearest holder; None when the home says no node has it (leased, so cacheable).

        Raises AbsentForNow (ENOENT, not cached by anyone) when the answer is not a leased
        one: the home could not be asked or not every node could be listed.
        """
        local = await self._local(path)
        if local is not None:
            return local
        now = trio.current_time()
        if not fresh:
            cached = self._positive.get(path)
            if cached is not None and cached[1] > now:
                self._hits += 1
                return cached[0]
            until = self._negative.get(path)
            if until is not None and until - now >= self.negative_ttl + 1.5:
                self._negative_hits += 1
                return None
            listed = self._listed(path, now)
            if listed is not None:
                self._hits += 1
                self._flood.learn(path, listed)  # its last holder: a claim while every home is cut off asks it
                return listed
        while (flight := self._inflight.get(path)) is not None:
            await flight.done.wait()
            if flight.finished and not fresh:
                return flight.result
        self._misses += 1
        flight = self._inflight[path] = _Flight()
        try:
            flight.result = await self._ask_home(path, flight)
            flight.finished = True
        finally:
            del self._inflight[path]
            flight.done.set()
        if flight.result is not None:
            self.learn(path, flight.result)
        return flight.result

    async def _ask_home(self, path: str, flight: _Flight) -> Location | None:
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

    def _streak(self, directory: str, found: bool, listable: bool) -> None:
        """Count names found in `directory` through its home (a miss does not count; a directory
        too big or split to list ends the streak)."""
        if not listable:
            self._streaks.pop(directory, None)
            return
        if not found:
            return
        self._streaks[directory] = self._streaks.get(directory, 0) + 1
        self._streaks.move_to_end(directory)
        if len(self._streaks) > LIST_AHEAD_KEPT:
            self._streaks.popitem(last=False)

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
        if self._streaks.get(directory, 0) < LIST_AHEAD_AFTER:
            return False
        kept = self._listings.get(directory)
        if kept is not None and kept.until > trio.current_time():
            return False
        dropped = self._unlisted.get(directory)
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
        looked at too: a file written straight into it is a holder before a scan tells the home."""
        local = await self._local(path)
        now = trio.current_time()
        until = self._negative.get(path)
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
            try:
                reply: IndexLookupReply | None = await self._dir_call(directory,
                                                                      msg.IndexLookup(directory, name, None))
            except PeerUnavailable:
                reply = None
            if reply is None or not reply.complete or reply.pending:
                self._fallbacks += 1
                return await self._flood.find_all(path, strict=strict)
            holders = reply.holders
        if any(holder.replica_of is not None for holder in holders):
            self._fallbacks += 1  # whether a staged replica is still valid only its source can tell
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
                self._note_home(_join(directory, name), home, reply.home_lease, now, revoked)
        listing = _Listing({row.name: row.holders for row in reply.entries}, now + reply.lease)
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

    def _entries(self, listing: _Listing) -> list[tuple[str, list[Location]]]:
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
        for _ in range(_MAX_HOPS):
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

    # -- changes -------------------------------------------------------------------

    async def _ancestors_missing_here(self, path: str) -> list[str]:
        """Parent directories of `path` this export lacks (a create here makes them), top first."""
        missing: list[str] = []
        directory = split_parent(path)[0]
        while directory != "/":
            if await self._peers.ask(self._peers.me, msg.Lookup(directory)) is not None:
                break
            missing.append(directory)
            directory = split_parent(directory)[0]
        return missing[::-1]

    async def claim(self, path: str, *, is_dir: bool = False) -> Location | None:
        """Before a create here: the holder if `path` exists; else the name is this node's at its home
        (one round trip; more only for parent directories this export lacks). A new directory's
        home is at this node's site (`Homes.of_creator`): this node knows it without asking."""
        local = await self._local(path)
        if local is not None:
            return local
        try:
            missing = await self._ancestors_missing_here(path)
            for parent in missing:
                directory, name = split_parent(parent)
                made = await self._dir_call(directory, msg.IndexClaim(directory, name, self._peers.me, True, False))
                await self._keep_record(parent, made)
            directory, name = split_parent(path)
            for _ in range(20):
                try:
                    sent, revoked = trio.current_time(), self._revoked
                    reply, stood_in_for = await self._dir_call_via(
                        directory, msg.IndexClaim(directory, name, self._peers.me, is_dir, True))
                    break
                except OSError as exc:
                    if isinstance(exc, PeerUnavailable) or exc.errno != errno.EAGAIN:
                        raise
                    await trio.sleep(0.05)  # another node is creating it right now
            else:
                raise OSError(errno.EAGAIN, f"{path} is being created on another node; try again")
        except PeerUnavailable as exc:
            return await self._claim_by_search(path, exc)
        others = reply.holders
        if is_dir and not others:
            await self._keep_record(path, reply)
        if others:
            found = self._nearest(others) or Location(others[0].node, others[0].attr)
            self.learn(path, found)  # the create opens it next: not from a "not found" cached before
            return found
        if stood_in_for is not None:
            held = await self._check_last_holder(path, stood_in_for)
            if held is not None:
                return held
        if is_dir and self.homes.central is None:
            self._note_home(path, self.homes.of_creator(path, self._peers.me), self.home_lease, sent, revoked)
        for parent in missing:
            await self._watch_here(parent)
        self._claimed.add(path)
        if reply.seeded:
            self._seeded.add(path)
        self.forget_absent(path, is_dir)  # "not found" for it, and for names in it (kept for a missing parent)
        return None

    async def _keep_record(self, path: str, reply: msg.IndexClaimReply) -> None:
        """The claim of the new directory `path` was taken by a node whose backup is this one: keep
        the record of its home (at this node's site) here, as that node would have sent it."""
        if not reply.keep:
            return
        directory, name = split_parent(path)
        home = self.homes.of_creator(path, self._peers.me)
        seed = self._peers.me if reply.seeded else None
        await self._peers.ask(self._peers.me, msg.IndexRecords(directory, {name: home}, seed))

    async def _watch_here(self, directory: str) -> None:
        """A create here is about to make `directory` in this export: have this node's
        ExportWatcher send files copied into it later to its home (no home lists it here)."""
        try:
            home = await self._home_node(directory)
            await self._peers.ask(self._peers.me, msg.IndexListdir(directory, home))
        except OSError as exc:
            log.info("%s will not be watched for files copied in: %s", directory, exc)

    async def _check_last_holder(self, path: str, home: str) -> Location | None:
        """A backup stood in for `home` and could not list it: if this node last saw `path` on a
        node that is not the home's stand-in's to see (the dead home itself), ask that node, as
        the search would -- a create must not make a twin of a file that is only out of reach.
        Returns that node's file when it has it (the claim is withdrawn: the create opens it);
        raises PeerUnavailable (EIO) when that node cannot be asked."""
        last = self._flood.last_holder(path)
        if last is None or last == self._peers.me:
            return None
        try:
            held = await self._peers.ask(last, msg.Lookup(path))
        except PeerUnavailable as exc:
            await self.withdraw_claim(path)
            raise PeerUnavailable(last, f"it held {path} when last seen and cannot be asked now (the home "
                                        f"{home} is down too); try again when it is back") from exc
        if held is None:
            return None
        await self.withdraw_claim(path)
        found = Location(last, held)
        self.learn(path, found)
        return found

    async def withdraw_claim(self, path: str) -> None:
        self._claimed.add(path)
        await self.withdraw(path)

    async def _claim_by_search(self, path: str, exc: PeerUnavailable) -> Location | None:
        """A home is unreachable: ask every node, as GMount does; announce the create to all of them."""
        log.info("claiming %s by asking every node: %s", path, exc)
        self._fallbacks += 1
        found = await self._flood.claim(path)
        if found is None:
            self._unclaimed.add(path)
            # the indexes of its directory and of the parents made here miss this create
            for directory in {split_parent(p)[0] for p in [path, *await self._ancestors_missing_here(path)]}:
                self._owe_home_of(directory)
        return found

    async def withdraw(self, path: str) -> None:
        self._unclaimed.discard(path)
        if path not in self._claimed:
            return
        self._claimed.discard(path)
        cached = self._homes.pop(path, None)
        directory, name = split_parent(path)
        try:
            await self._dir_call(directory, msg.IndexDrop(directory, name, [self._peers.me]))
        except OSError as exc:
            log.info("could not withdraw the claim on %s at the home of %s: %s", path, directory, exc)
            self._owe_home_of(directory)
        if path in self._seeded:  # the mkdir failed here: its seeded index goes (a later one starts anew)
            self._seeded.discard(path)
            own_home = cached[0] if cached is not None else self.homes.central
            if own_home is not None:
                await self._forget_index_at(own_home, path)

    async def announce_created(self, path: str, is_dir: bool = False) -> None:
        """A claimed create needs nothing more (the claim told everyone). A name made here without a
        claim (a put) is recorded at its home now; without a reachable home every node is told."""
        location = self._just_created.pop(path, None)
        if path in self._claimed:
            self._claimed.discard(path)
            seeded = path in self._seeded
            self._seeded.discard(path)
            if is_dir:
                await self._seed(path, told_home=seeded)
            return
        if path in self._unclaimed:
            self._unclaimed.discard(path)
            await self._flood.announce_created(path, is_dir)
            return
        directory, name = split_parent(path)
        try:
            await self._dir_call(directory, msg.IndexSet(directory, name, self._peers.me,
                                                         None if location is None else location.attr, None, is_dir))
        except OSError as exc:
            log.info("could not record %s at the home of %s: %s; telling every node", path, directory, exc)
            self._owe_home_of(directory)
            await self._flood.announce_created(path, is_dir)

    async def _seed(self, directory: str, *, told_home: bool = False) -> None:
        """A mkdir here: tell the new directory's home (at this site) that it starts empty, so
        the first lookup or create in it does not make the home list every node -- unless the
        claim's server did (`told_home`: the home is that node or its backup)."""
        cached = self._homes.get(directory)
        if cached is None:
            return
        try:
            # this export's copy is watched like a listed one (files copied into it reach the home)
            await self._peers.ask(self._peers.me, msg.IndexListdir(directory, cached[0]))
            if not told_home:
                await self._home_call(cached[0], msg.IndexSeed(directory, self._peers.me))
        except OSError as exc:
            log.info("could not tell %s that the new directory %s is empty: %s", cached[0], directory, exc)

    async def announce_changed(self, path: str, location: Location) -> None:
        directory, name = split_parent(path)
        self._drop_listing(directory)  # not revoked by the home: this node is the asker
        try:
            await self._dir_call(directory, msg.IndexSet(directory, name, location.node, location.attr,
                                                         location.replica_of, location.attr.is_dir, self._peers.me))
        except OSError as exc:
            log.info("could not record the change of %s at the home of %s: %s", path, directory, exc)
            self._owe_home_of(directory)

    async def change(self, node: str, path: str, request: Request[R]) -> R:
        """`request` (chmod, utimens, truncate, unlink, a file's rename: `_RECORDED_OPS`) on `node`,
        the one holder of `path`, recorded at its directory's home before this returns. When
        `node` is nearer that home than this node (the home is at the holder's site, this node
        at another), `node` records it (msg.Recorded): one round trip across the WAN, not one
        to the holder and another to the home."""
        directory, name = split_parent(path)
        directories = [directory]
        home = self._relay_home(node, directory)
        if isinstance(request, msg.Rename) and split_parent(request.dst)[0] != directory:
            directories.append(split_parent(request.dst)[0])
            home = None  # two directories, two homes: this node records it
        begun = [self._begin_own_change(d) for d in directories]
        applied = False
        try:
            if home is not None:
                result = await self._peers.ask(node, msg.Recorded(home, self._peers.me, request))
            else:
                result = await self._peers.ask(node, request)
                await self._record(node, path, request, result, self._peers.me, None)
            applied = True
        finally:
            listings = [self._end_own_change(d, listing, generation, applied)
                        for d, (listing, generation) in zip(directories, begun, strict=True)]
        if isinstance(request, msg.Rename):
            holders = listings[0].take(name) if listings[0] is not None else None
            target = listings[-1]
            if target is not None and holders is not None:
                target.put(split_parent(request.dst)[1], holders)
            elif target is not None:
                self._drop_listing(directories[-1])
        elif listings[0] is not None:
            kept = (listings[0].remove(name, node) if isinstance(request, msg.Unlink) else
                    isinstance(result, Attr) and listings[0].set_attr(name, node, result))
            if not kept:
                self._drop_listing(directory)
        return result

    def _begin_own_change(self, directory: str) -> tuple[_Listing | None, int]:
        """Before a change here in `directory`: the listing kept of it, and this change's number.
        The home does not revoke this node's listing for its own change: `_end_own_change` applies it."""
        if directory in self._listing_stale:
            self._listing_stale[directory] = True  # a listing under way may predate the change
        counts = self._own_changes.setdefault(directory, [0, 0])
        counts[0] += 1
        counts[1] += 1
        return self._listings.get(directory), counts[0]

    def _end_own_change(self, directory: str, listing: _Listing | None, generation: int,
                        applied: bool) -> _Listing | None:
        """The listing the change begun as `generation` may be applied to: the one kept when it
        began, still leased, with no other change here begun meanwhile (their records may reach
        the home in another order). Any other listing of `directory` is dropped."""
        if directory in self._listing_stale:
            self._listing_stale[directory] = True  # a listing under way may predate the change too
        counts = self._own_changes[directory]
        alone = counts[0] == generation
        counts[1] -= 1
        if not counts[1]:
            del self._own_changes[directory]
        current = self._listings.get(directory)
        if current is None:
            return None
        if applied and alone and current is listing and current.until > trio.current_time():
            return current
        self._drop_listing(directory)
        return None

    def _relay_home(self, node: str, directory: str) -> str | None:
        """The home `node` should record a change of `directory` at (None: this node records it):
        only a home known here, of a directory not split, nearer `node` than this node."""
        if node == self._peers.me or directory in self._parts:
            return None
        home = self._known_home(directory)
        if home is None or self._distance(node, home) >= self._distance(self._peers.me, home):
            return None
        return home

    def _known_home(self, directory: str) -> str | None:
        """The home of `directory` as known here without a message (None: not known now)."""
        if directory == "/" or self.homes.central is not None:
            return self.homes.home(directory)
        cached = self._homes.get(directory)
        return cached[0] if cached is not None and cached[1] > trio.current_time() else None

    def _distance(self, a: str, b: str) -> float:
        """How far a round trip from `a` to `b` goes: none to itself, then within a site, then to
        other sites by the overlay's RTT (unknown: as far as can be)."""
        if a == b:
            return 0.0
        site_a, site_b = self.homes.site_of.get(a), self.homes.site_of.get(b)
        if site_a == site_b:
            return 1.0
        return 2.0 + self.homes.site_rtt.get((str(site_a), str(site_b)), float("inf"))

    async def _record(self, node: str, path: str, request: Request[Any], result: Any, asker: str,
                      home: str | None) -> None:
        """Record `request`, made on `node` with `result`, at the home of the directory of `path`
        (`home`, when an asker told it) as a change `asker` made."""
        directory, name = split_parent(path)
        record: Request[None] | Request[list[str]]
        if isinstance(request, msg.Rename):
            await self._record_renamed(request.src, request.dst, False, [node], asker, home)
            return
        if isinstance(request, msg.Unlink):
            record = msg.IndexDrop(directory, name, [node], asker)
        elif isinstance(result, Attr):
            record = msg.IndexSet(directory, name, node, result, None, result.is_dir, asker)
        else:
            raise TypeError(f"{request.op} is not a change a home records")
        try:
            await self._dir_call_via(directory, record, home)
        except OSError as exc:
            log.info("could not record the change of %s at the home of %s: %s", path, directory, exc)
            self._owe_for(directory, home)

    async def op_recorded(self, home: str, asker: str, op: str, args: list[Any]) -> Any:
        """msg.Recorded: the change `op` to a file this node holds, made here for `asker` and
        recorded at `home` before the reply."""
        if op not in _RECORDED_OPS:
            raise OSError(errno.EINVAL, f"node {self._peers.me} does not record {op!r} for another node")
        request = msg.REQUESTS[op](*args)
        assert isinstance(request, msg.Chmod | msg.Utimens | msg.Truncate | msg.Unlink | msg.Rename)
        result = await self._peers.call(self._peers.me, op, *args)
        path = request.src if isinstance(request, msg.Rename) else request.path
        await self._record(self._peers.me, str(path), request, request.decode(result), str(asker), str(home))
        return result

    async def announce_removed(self, path: str, nodes: list[str], is_dir: bool = False) -> None:
        directory, name = split_parent(path)
        own_home: str | None = None
        if is_dir:  # its own index goes too: a directory made again under this name starts empty
            cached = self._homes.get(path)
            own_home = cached[0] if cached is not None else None
            if own_home is None and self.homes.central is not None:
                own_home = self.homes.home(path)
            self._forget_homes([path])
        self._drop_listing(directory)  # not revoked by the home: this node is the asker
        if own_home == self._peers.me:  # its index here goes here; the others' with the drop
            await self._forget_index_at(own_home, path)
        parent_home = self._known_home(directory)
        keep = is_dir and parent_home is not None and self.homes.backup(directory, parent_home) == self._peers.me
        if keep:  # this node keeps the copy of the parent's records: the home sends none
            await self._peers.ask(self._peers.me, msg.IndexRecords(directory, {name: None}))
        try:
            unreached = await self._dir_call(directory, msg.IndexDrop(directory, name, nodes, self._peers.me,
                                                                      own_home, keep))
        except OSError as exc:
            log.info("could not record the removal of %s at the home of %s: %s", path, directory, exc)
            self._owe_home_of(directory)
            if own_home not in (None, self._peers.me):
                await self._forget_index_at(own_home, path)
        else:
            for home in unreached:
                self._owe(home, path)
        if is_dir:  # again: the parent's home does not revoke here a home of `path` learnt meanwhile
            self._forget_homes([path])

    async def _forget_index_at(self, home: str, directory: str) -> None:
        """`directory` is gone (or was never made): its home drops its index; owed when it does not answer."""
        try:
            await self._home_call(home, msg.IndexForget([directory]))
        except OSError as exc:
            log.info("could not tell %s, the home of %s, that it is gone: %s", home, directory, exc)
            self._owe(home, directory)

    async def announce_renamed(self, src: str, dst: str, is_dir: bool, holders: list[str]) -> None:
        """Drop `src` at its directory's home, record `dst` at its own (revoking "not found"). A
        directory's descendants change path, and so home: every node forgets their homes and indexes."""
        self._drop_listing(split_parent(src)[0])  # not revoked by their homes: this node is the asker
        self._drop_listing(split_parent(dst)[0])
        await self._record_renamed(src, dst, is_dir, holders, self._peers.me, None)

    async def _record_renamed(self, src: str, dst: str, is_dir: bool, holders: list[str], asker: str,
                              home: str | None) -> None:
        """announce_renamed's records, as a rename `asker` made (`home`: of both names' directory,
        as the asker knows it, when the holder records a rename for it)."""
        src_dir, src_name = split_parent(src)
        dst_dir, dst_name = split_parent(dst)
        if not await self._renamed_at_one_home(src, dst, is_dir, holders, asker, home):
            try:
                await self._dir_call_via(src_dir, msg.IndexDrop(src_dir, src_name, None, asker), home)
            except OSError as exc:
                log.info("could not record the rename of %s: %s", src, exc)
                self._owe_for(src_dir, home)
            try:
                await self._dir_call_via(dst_dir, msg.IndexReplace(dst_dir, dst_name, holders, is_dir, asker),
                                         home if dst_dir == src_dir else None)
            except OSError as exc:
                log.info("could not record the rename to %s: %s; telling every node", dst, exc)
                self._owe_for(dst_dir, home if dst_dir == src_dir else None)
                await self._flood.announce_created(dst, is_dir)
        if is_dir:
            await self._forget_everywhere([src, dst])

    async def _renamed_at_one_home(self, src: str, dst: str, is_dir: bool, holders: list[str], asker: str,
                                   home: str | None) -> bool:
        """A rename within one directory, in one message to its home (IndexRename); False when
        the two messages are needed instead: two directories, or names a split directory serves
        on different nodes."""
        directory, src_name = split_parent(src)
        dst_dir, dst_name = split_parent(dst)
        if dst_dir != directory:
            return False
        bitmap = self._parts.get(directory)
        if bitmap is not None and partition_of(name_hash(src_name), bitmap) != partition_of(name_hash(dst_name),
                                                                                             bitmap):
            return False
        try:
            await self._dir_call_via(directory, msg.IndexRename(directory, dst_name, src_name, holders, is_dir,
                                                                asker), home)
        except OSError as exc:
            if not isinstance(exc, PeerUnavailable) and exc.errno == errno.EXDEV:
                return False  # split in partitions this node did not know of yet
            log.info("could not record the rename of %s to %s: %s; telling every node", src, dst, exc)
            self._owe_for(directory, home)
            await self._flood.announce_created(dst, is_dir)
        return True

    async def announce_unsure(self, paths: list[str]) -> None:
        """A change failed half-way: the homes of the paths' directories list them again."""
        for path in paths:
            directory = split_parent(path)[0]
            try:
                home = await self._home_node(directory)
            except PeerUnavailable:
                continue
            try:
                await self._home_call(home, msg.IndexForget([directory]))
            except OSError:
                self._owe(home, directory)
        self._forget_cached(paths)

    async def _forget_everywhere(self, prefixes: list[str]) -> None:
        async def tell(node: str) -> None:
            try:
                if node != self._peers.me:
                    self._remote += 1
                await self._peers.ask(node, msg.IndexUnhome(prefixes, True))
            except OSError as exc:
                log.info("could not tell %s to forget the homes and indexes under %s: %s", node, prefixes, exc)

        async with open_nursery() as nursery:
            for node in self.order:
                nursery.start_soon(tell, node)

    # -- caches --------------------------------------------------------------------

    def rank(self, node: str) -> int:
        return self._rank.get(node, len(self._rank))

    def learn(self, path: str, location: Location) -> None:
        self._flood.learn(path, location)  # its last holder: if that node dies, the search says EIO
        self._negative.pop(path, None)
        now = trio.current_time()
        self._positive[path] = (location, now + self.ttl)
        self._positive.move_to_end(path)
        drop_expired(self._positive, lambda cached: cached[1], now)
        if len(self._positive) > self._max:
            self._positive.popitem(last=False)

    def note_created(self, path: str, location: Location) -> None:
        self._just_created[path] = location
        if len(self._just_created) > 1024:  # a create that never announced (failed after): bounded
            self._just_created.pop(next(iter(self._just_created)))
        self.learn(path, location)
        self._positive.pop(split_parent(path)[0], None)
        self._drop_listing(split_parent(path)[0])

    def note_removed(self, path: str) -> None:
        """After an unlink or rmdir here (the listing of its directory: see `change`, `announce_removed`)."""
        self._positive.pop(path, None)
        self._positive.pop(split_parent(path)[0], None)
        self._mark_stale(path)

    def note_renamed(self, src: str, dst: str, is_dir: bool) -> None:
        """After a rename here (the listings of its directories: see `change`, `announce_renamed`)."""
        self._forget_cached([src, dst], subtree=is_dir, listings=False)
        for path in (src, dst):
            self._positive.pop(split_parent(path)[0], None)
        if is_dir:
            self._forget_homes([src, dst])

    def _forget_cached(self, paths: list[str], subtree: bool = False, listings: bool = True) -> None:
        for cache in (self._positive, self._negative):
            for path in paths:
                cache.pop(path, None)
                if subtree:
                    for key in [k for k in cache if k.startswith(path + "/")]:
                        del cache[key]
        for path in paths:
            if listings:
                self._drop_listing(split_parent(path)[0])
            self._mark_stale(path)

    def invalidate(self, path: str) -> None:
        self._positive.pop(path, None)
        self._negative.pop(path, None)
        self._drop_listing(split_parent(path)[0])
        self._mark_stale(path)
        self._flood.invalidate(path)

    def forget_absent(self, path: str, is_dir: bool = False) -> None:
        """A home (or a node without one) says `path` exists now: drop "not found" for it and its parents."""
        self._positive.pop(path, None)
        self._drop_listing(split_parent(path)[0])
        if is_dir:
            for key in [k for k in self._negative if k.startswith(path + "/")]:
                del self._negative[key]
        while path not in ("/", ""):
            self._negative.pop(path, None)
            self._mark_stale(path)
            path = split_parent(path)[0]

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

    def _mark_stale(self, path: str) -> None:
        flight = self._inflight.get(path)
        if flight is not None:
            flight.stale = True

    def _remember_negative(self, path: str, until: float) -> None:
        self._negative[path] = until
        self._negative.move_to_end(path)
        drop_expired(self._negative, lambda until: until, trio.current_time())
        if len(self._negative) > self._max:
            self._negative.popitem(last=False)

    def statistics(self) -> LocatorStatistics:
        return LocatorStatistics(self._hits, self._negative_hits, self._misses, self._remote, len(self._positive))

    @property
    def fallbacks(self) -> int:
        """Lookups and changes that had to ask every node (a home and its backup unreachable, or
        a directory not listed on every node)."""
        return self._fallbacks

    @property
    def takeovers(self) -> int:
        """Requests sent to a backup because the home did not answer."""
        return self._takeovers

    @property
    def lists_ahead(self) -> int:
        """Lookups answered by asking for their directory's whole listing (see LIST_AHEAD_AFTER)."""
        return self._lists_ahead

    @property
    def redirects(self) -> int:
        """Requests a node answered "that name is in a partition another node serves" (a stale map)."""
        return self._redirected


def message_counts(counter: Counter[str]) -> dict[str, int]:
    """A plain dict of a per-operation message counter, for `stats` and `status --json`."""
    return dict(sorted(counter.items()))
