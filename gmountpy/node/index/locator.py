"""`IndexLocator`: the `Locator` that asks the home of a path's directory instead of every node.

Built in layers: `routing` (the caches, and the way to a directory's home, backup or
partition server), `lookups` (finding), `changes` (claims and records of changes). This
module adds what homes send this node: the revocations of homes and listings, and the
changes a far asker has this node record.
"""

from __future__ import annotations

from ...protocol import messages as msg
from ..locator import LocatorStatistics
from .changes import Changes


class IndexLocator(Changes):
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

    def operations(self) -> msg.Operations:
        """The revocations homes send to this node, and the changes it records for far askers, for
        NodeService's `extra` table."""
        return msg.operations(self.op_unhome, self.op_unlist, self.op_recorded)

    async def op_unhome(self, request: msg.IndexUnhome) -> None:
        """The directories under `prefixes` are gone or moved: forget their homes, listings and the
        "not found" under them (a directory made again there may be homed elsewhere).
        `indexes`: this node's own index of them goes too (a directory rename)."""
        self._forget_homes(request.prefixes)
        if request.indexes and self.index is not None:
            self.index.forget(request.prefixes)

    async def op_unlist(self, request: msg.IndexUnlist) -> None:
        """The listing of `directory` handed out by its home changed."""
        self._revoked += 1
        self._drop_listing(request.directory)

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
