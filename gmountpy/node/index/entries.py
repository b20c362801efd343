"""What a home keeps of one directory: each name with its holders, as built from the exports.

The index is soft state: a home builds a directory's entries by asking every node for
its listing, and keeps them up to date with the changes nodes tell it (creates, closes
after writes, unlinks, renames, staging, export scans). A claim (a create under way)
is an entry without attributes until its holder has the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...protocol.attr import Attr

#: A claim whose file the home cannot see on its holder yet counts as "being created" this long
#: (a create takes milliseconds; this covers a loaded node); after that (the creator died, or its
#: create failed and the withdrawal was lost) it is dropped. Meanwhile a create of the same name
#: elsewhere fails with EAGAIN.
CLAIM_GRACE = 10.0


@dataclass
class Holder:
    is_dir: bool
    attr: Attr | None              # None: claimed (being created) or renamed here; asked of the holder
    replica_of: str | None = None  # a staged replica of that node's file
    since: float | None = None     # when a claim or a close told the home (None: from a listing)
    renamed: bool = False          # attr None after a rename: the file exists; asked of its holder when listed

    def recent(self, now: float) -> bool:
        """Told by a claim or a close within CLAIM_GRACE: newer than a scan's listing may be."""
        return self.since is not None and now - self.since < CLAIM_GRACE


Entries = dict[str, dict[str, Holder]]          # name -> node -> holder
Change = tuple[str, str | None, Holder | None]  # (name, node or None = every node, holder or None = removed)


@dataclass
class BuiltDirectory:
    entries: Entries
    built_at: float
    missing: tuple[str, ...]  # nodes that could not be listed: misses are not definite
    exists: bool = True       # some node listed it (an empty index of a missing directory is not a listing)
    holders: set[str] = field(default_factory=set)  # nodes whose export has the directory (as far as known)
    used: float = -math.inf   # when a request last read it

    def claimed(self, now: float) -> bool:
        """Whether a name in it is being created (a recent claim: not on its holder's disk yet)."""
        return any(holder.attr is None and not holder.renamed and holder.recent(now)
                   for holders in self.entries.values() for holder in holders.values())


@dataclass
class Parts:
    """What this node knows of a split directory: its home (the server of partition 0) and the
    partitions known to exist (Giga+'s bitmap). The partitions this node serves follow from them
    (`Homes.of_partition`); every partition it serves has all its children in `bitmap` (only
    this node splits them), so its names are exactly those `partition_of` maps to it."""

    home: str
    bitmap: set[int]


def same_but_atime(before: Holder | None, after: Holder) -> bool:
    """Would a listing show the same for this holder? (A read moves atime; that is no change.)"""
    if before is None or before.attr is None or after.attr is None or before.replica_of != after.replica_of:
        return before is not None and before.attr is None and after.attr is None
    return before.attr._replace(atime_ns=0) == after.attr._replace(atime_ns=0)


def apply_change(entries: Entries, change: Change) -> None:
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
