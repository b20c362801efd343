"""The running clusters as seen from this machine's mounts, in a few milliseconds.

Code on the hot path of every job (make's `gmount-sh` runs once per recipe)
cannot afford `gmountpy.api`: importing trio, networkx and the launcher costs
far more than a small recipe. This module answers what such code needs --
which cluster and node a path on this machine belongs to, the same path in
another node's mount, who holds which input, node-to-node RTTs -- from the
launcher's state files and the mounts' `user.gmount.*` xattrs, with the
standard library only. Everything else goes through `gmountpy.api.Cluster`.
"""

from __future__ import annotations

import heapq
import json
import os
import posixpath
import stat

TYPE_CHECKING = False  # typing is not imported at run time: per-job wrappers import this module
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MountNode", "MountedCluster", "find", "state_dir"]

WHERE_XATTR = "user.gmount.where"


def state_dir() -> str:
    """Where the launcher keeps running clusters (the same place as `gmountpy.state.state_dir`)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "gmountpy", "clusters")


class MountNode:
    """One node of a running cluster: its site, job slots, mountpoint and export."""

    __slots__ = ("export", "mountpoint", "name", "remote", "site", "slots")

    def __init__(self, name: str, site: str, slots: int, mountpoint: str, export: str, remote: bool) -> None:
        self.name = name
        self.site = site
        self.slots = slots
        self.mountpoint = mountpoint
        self.export = export
        self.remote = remote  # reached over SSH: its mount is on another machine

    def __repr__(self) -> str:
        return f"<MountNode {self.name} ({self.site}) at {self.mountpoint}>"


class MountedCluster:
    """A running cluster, read from its state file: nodes in cluster-file order, sites and RTTs."""

    def __init__(self, data: dict[str, Any]) -> None:
        spec = data["spec"]
        records = data["nodes"]
        self.name: str = spec["name"]
        self.launcher: str = spec["launcher"]
        self.intra_site_rtt_ms = float(spec["intra_site_rtt_ms"])
        self.sites: dict[str, list[str]] = {site: list(names) for site, names in spec["sites"].items()}
        site_of = {node: site for site, names in self.sites.items() for node in names}
        self.nodes: dict[str, MountNode] = {}
        for name, node in spec["nodes"].items():
            record = records.get(name, {})
            remote = spec["launcher"] == "ssh" or record.get("ssh") is not None
            self.nodes[name] = MountNode(name, site_of[name], int(node.get("slots", 1)), node["mountpoint"],
                                         node["export"], remote)
        self._site_rtt = _site_distances(self.sites, spec["links"])

    @property
    def ssh(self) -> bool:
        return any(node.remote for node in self.nodes.values())

    def rtt(self, a: str, b: str) -> float:
        """Estimated RTT in ms between two nodes (0 to itself), as `gmountpy.Overlay.rtt` computes it."""
        if a == b:
            return 0.0
        site_a, site_b = self.nodes[a].site, self.nodes[b].site
        if site_a == site_b:
            return self.intra_site_rtt_ms
        return self._site_rtt[site_a][site_b]

    def node_for_path(self, path: str) -> tuple[str, str] | None:
        """(node, namespace path) for a path inside one of this machine's mounts of this cluster."""
        real = os.path.abspath(path)
        for node in self.nodes.values():
            mount = node.mountpoint.rstrip("/")
            if real != mount and not real.startswith(mount + "/"):
                continue
            if node.remote and not os.path.ismount(node.mountpoint):
                continue  # a remote node's mountpoint: that path is not on this machine
            return node.name, real[len(mount):] or "/"
        return None

    def path_on(self, node: str, ns_path: str) -> str:
        """The path of namespace path `ns_path` inside `node`'s mount."""
        return posixpath.join(self.nodes[node].mountpoint, ns_path.lstrip("/"))

    def holdings(self, paths: list[str], cwd: str | None = None) -> dict[str, dict[str, int]]:
        """holdings[namespace path][node] = bytes, for `gmountpy.placement.choose_node`.

        Paths are relative to `cwd` (default: the current directory); paths
        outside this cluster's mounts are not in the namespace and are left
        out; a path no node holds maps to {}. A directory stands for every
        file below it, as in `Cluster.place`. Holders come from the mount's
        `user.gmount.where` xattr; each is credited with the size the mount
        shows (replicas have their source's size).
        """
        base = os.getcwd() if cwd is None else cwd
        result: dict[str, dict[str, int]] = {}
        for path in paths:
            absolute = os.path.join(base, path)
            found = self.node_for_path(absolute)
            if found is not None:
                self._hold(absolute, found[1], result)
        return result

    def _hold(self, absolute: str, ns_path: str, result: dict[str, dict[str, int]]) -> None:
        if ns_path in result:
            return
        try:
            info = os.stat(absolute)
        except OSError:
            result[ns_path] = {}
            return
        if stat.S_ISDIR(info.st_mode):
            try:
                names = sorted(os.listdir(absolute))
            except OSError:
                names = []
            for name in names:
                self._hold(os.path.join(absolute, name), posixpath.join(ns_path, name), result)
            return
        try:
            holders = os.getxattr(absolute, WHERE_XATTR).decode().split()
        except OSError:
            holders = []
        result[ns_path] = {node: info.st_size for node in holders if node in self.nodes}


def find(path: str) -> tuple[MountedCluster, str, str] | None:
    """The running cluster, node and namespace path for a path inside a mount on this machine."""
    try:
        names = sorted(f for f in os.listdir(state_dir()) if f.endswith(".json") and not f.endswith(".tls.json"))
    except FileNotFoundError:
        return None
    for name in names:
        try:
            with open(os.path.join(state_dir(), name)) as f:
                cluster = MountedCluster(json.load(f))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # damaged or half-written: `gmount status` reports those
        found = cluster.node_for_path(path)
        if found is not None:
            return cluster, found[0], found[1]
    return None


def _site_distances(sites: dict[str, list[str]], links: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Shortest-path RTT between every pair of sites (Dijkstra; a fast detour beats a slow direct link)."""
    graph: dict[str, list[tuple[str, float]]] = {site: [] for site in sites}
    for link in links:
        a, b = link["sites"]
        graph[a].append((b, float(link["rtt_ms"])))
        graph[b].append((a, float(link["rtt_ms"])))
    distances: dict[str, dict[str, float]] = {}
    for source in sites:
        best: dict[str, float] = {source: 0.0}
        queue = [(0.0, source)]
        while queue:
            dist, site = heapq.heappop(queue)
            if dist > best.get(site, float("inf")):
                continue
            for other, rtt in graph[site]:
                if dist + rtt < best.get(other, float("inf")):
                    best[other] = dist + rtt
                    heapq.heappush(queue, (dist + rtt, other))
        distances[source] = best
    return distances
