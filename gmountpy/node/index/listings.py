"""Listings a node keeps of directories homed elsewhere, under the home's lease.

A node that has found a few names in one directory through its home asks for the whole
listing with the next lookup (the same round trip) and answers later names in it from
that listing while the lease lasts: reading, changing or renaming many files of one
remote directory costs about one round trip per second for their lookups, not one per
file (IndexFS-style directory leases). The home revokes a listing when another node
changes the directory; a change this node makes there it applies itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...protocol.attr import Attr
from ...protocol.messages import IndexHolder

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


@dataclass
class Listing:
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
