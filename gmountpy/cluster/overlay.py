"""The locality overlay: which peers a node asks first when it looks a path up.

GMount's locality-aware search asks the nearest nodes first (itself, then its
own site, then sites in order of RTT), so a file that exists nearby is found
without waiting on the wide-area links.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

from gmountpy.cluster.config import ClusterSpec


class Overlay:
    """Site graph weighted by RTT and each node's lookup order (GMount's locality-aware search)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.graph: nx.Graph[str] = nx.Graph()
        for site, names in spec.sites.items():
            self.graph.add_node(site, nodes=tuple(names))
        for link in spec.links:
            self.graph.add_edge(*link.sites, rtt_ms=link.rtt_ms)
        self._site_of: dict[str, str] = {node: site for site, names in spec.sites.items() for node in names}
        # All-pairs distances up front: clusters are small and lookups are on the hot path.
        self._dist: dict[str, dict[str, float]] = {
            site: dict(nx.single_source_dijkstra_path_length(self.graph, site, weight="rtt_ms"))
            for site in spec.sites
        }
        for site, reach in self._dist.items():
            missing = [other for other in spec.sites if other not in reach]
            if missing:
                raise ValueError(f"sites {site!r} and {missing[0]!r} are not connected by any link")
        self._tiers: dict[str, tuple[tuple[str, ...], ...]] = {
            node: self._compute_tiers(node) for node in self._site_of}
        self._order: dict[str, tuple[str, ...]] = {
            node: tuple(name for tier in tiers for name in tier) for node, tiers in self._tiers.items()
        }
        self._rank: dict[str, dict[str, int]] = {
            node: {name: i for i, name in enumerate(order)} for node, order in self._order.items()
        }

    def site_of(self, node: str) -> str:
        """The site a node belongs to; KeyError for an unknown node."""
        try:
            return self._site_of[node]
        except KeyError:
            raise KeyError(f"unknown node {node!r}") from None

    def site_rtt(self, a: str, b: str) -> float:
        """Shortest-path RTT between sites, so a fast detour beats a slow direct link."""
        if a not in self._dist:
            raise KeyError(f"unknown site {a!r}")
        if b not in self._dist:
            raise KeyError(f"unknown site {b!r}")
        if a == b:
            return self.spec.intra_site_rtt_ms
        return self._dist[a][b]

    def rtt(self, a: str, b: str) -> float:
        """Estimated RTT between two nodes; 0 to itself."""
        site_a, site_b = self.site_of(a), self.site_of(b)
        if a == b:
            return 0.0
        return self.site_rtt(site_a, site_b)

    def lookup_tiers(self, node: str) -> list[tuple[str, ...]]:
        """Groups of equally distant nodes, nearest first; the node itself is the first tier."""
        self.site_of(node)
        return list(self._tiers[node])

    def lookup_order(self, node: str) -> list[str]:
        """Every node once, in the order a lookup from `node` should ask them."""
        self.site_of(node)
        return list(self._order[node])

    def nearest(self, node: str, candidates: Iterable[str]) -> list[str]:
        """Candidates (e.g. replica holders) sorted nearest first from `node`'s point of view."""
        self.site_of(node)
        rank = self._rank[node]
        result = list(candidates)
        for name in result:
            if name not in rank:
                raise KeyError(f"unknown node {name!r}")
        return sorted(result, key=rank.__getitem__)

    def _compute_tiers(self, node: str) -> tuple[tuple[str, ...], ...]:
        site = self._site_of[node]
        tiers: list[tuple[str, ...]] = [(node,)]
        same_site = tuple(name for name in self.spec.sites[site] if name != node)
        if same_site:
            tiers.append(same_site)
        others = sorted((s for s in self.spec.sites if s != site), key=lambda s: (self._dist[site][s], s))
        tiers.extend(tuple(self.spec.sites[s]) for s in others)
        return tuple(tiers)
