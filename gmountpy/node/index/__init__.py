"""Lookups that never flood: a homed directory index behind the `Locator` seam.

Every directory has a **home** node (`lookup = "index"`), or one fixed node for every
directory (`lookup = "central"`, the central-metadata baseline). The home keeps the
exact index of that directory and answers in one round trip; a dead home is replaced by
its backup at the same site; a large directory splits by hash over several nodes
(Giga+). The index is soft state, rebuilt from the exports. See docs/design.md, "The
directory index".

The package, bottom up (imports flow one way, each module from those above it here):

- `paths`, `homes`: how paths split, and where a directory's home, backup and
  partitions are (rules every node computes alike);
- `peers`: what the index needs of the peer pool, and listing a node's directory;
- the home's side: `entries` (what a home keeps of a directory), `store` (its state and
  lease tables), `partitions` (Giga+ splitting), `records` (the homes of
  subdirectories), `directory` (`DirectoryIndex`, the `index_*` operations);
- `watcher`: `ExportWatcher`, a node's export watched for changes made outside the mount;
- the asking side: `listings` (listings kept under lease), `routing` (the way to a
  home, its backup or a partition), `lookups`, `changes`, and `locator` (`IndexLocator`).
"""

from __future__ import annotations

from ...protocol.messages import MAX_PARTITIONS
from .directory import BACKED_OPS, PART_OPS, DirectoryIndex, IndexStatistics
from .entries import CLAIM_GRACE
from .homes import Homes, home_lease_for, name_hash, partition_depth, partition_of, rendezvous_order
from .listings import LIST_AHEAD_AFTER, LIST_AHEAD_MAX, LIST_AHEAD_QUIET, LISTINGS_KEPT
from .locator import IndexLocator
from .partitions import NAME_OPS
from .paths import split_parent
from .peers import Peers
from .routing import LocatorPeers
from .watcher import ExportWatcher

__all__ = [
    "CLAIM_GRACE", "LISTINGS_KEPT", "LIST_AHEAD_AFTER", "LIST_AHEAD_MAX", "LIST_AHEAD_QUIET", "MAX_PARTITIONS",
    "DirectoryIndex", "ExportWatcher", "Homes", "IndexLocator", "IndexStatistics", "LocatorPeers", "Peers",
    "home_lease_for", "name_hash", "partition_depth", "partition_of", "rendezvous_order", "split_parent",
]

# the operation tables tests/test_messages.py checks against the message types
_BACKED_OPS, _NAME_OPS, _PART_OPS = BACKED_OPS, NAME_OPS, PART_OPS
