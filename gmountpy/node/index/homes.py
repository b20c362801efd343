"""Where a directory's index lives: its home, its backup, and the servers of its partitions.

These are rules every node applies the same way, from the node list, the sites and the
overlay's RTTs alone, so no node has to ask where to send a request it can compute.

A directory made through the mount is homed at its creator's site (rendezvous hashing
over that site's nodes), so the files a site makes and looks up stay one intra-site round
trip away; hashing over every node would put 3 of 4 directories of a 2-site cluster at the
other site. A directory found in the exports is homed at a site that holds it. Such homes
cannot be computed from the path, so they are recorded in the parent's index and handed
out with lookups (see `records`); only the root's home is hashed.

A large directory splits by the hash of its names (Giga+): `name_hash`, `partition_of` and
`partition_depth` map a name to its partition, `Homes.of_partition` a partition to its node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field


def _weight(node: str, directory: str) -> int:
    digest = hashlib.blake2b(f"{node}\0{directory}".encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(directory: str, nodes: Sequence[str]) -> list[str]:
    """All nodes, the home of `directory` first (highest rendezvous weight; ties by name)."""
    return sorted(nodes, key=lambda node: (-_weight(node, directory), node))


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
    `records`). The backup is the next-ranked node at the home's site,
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
