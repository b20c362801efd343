"""The running clusters as seen from this machine's mounts, in a few milliseconds.

Code on the hot path of every job (make's `gmount-sh` runs once per recipe)
cannot afford `gmountpy.api`: importing trio, networkx and the launcher costs
far more than a small recipe. This module answers what such code needs --
which cluster and node a path on this machine belongs to, the same path in
another node's mount, who holds which input, node-to-node RTTs -- from the
launcher's state files and the mounts' `user.gmount.*` xattrs, with the
standard library only. Everything else goes through `gmountpy.api.Cluster`.

Even `json` (which imports `re`) is too slow to load per job: a state file
is parsed once and kept as a `marshal` copy (see `load_state`).
"""

from __future__ import annotations

import heapq
import marshal
import os
import posixpath
import stat

TYPE_CHECKING = False  # typing is not imported at run time: per-job wrappers import this module
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MountNode", "MountedCluster", "find", "load_state", "state_cache", "state_dir"]

WHERE_XATTR = "user.gmount.where"
#: xattr reads in flight at once for `holdings`: each asks every node, so their round trips overlap
PARALLEL_READS = 8


def state_dir() -> str:
    """Where the launcher keeps running clusters (the same place as `gmountpy.cluster.state.state_dir`)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "gmountpy", "clusters")


def state_cache(path: str) -> str:
    """Where `load_state` keeps its copy of the state file `path` (removed with the cluster's state)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "mounts-cache",
                        os.path.splitext(os.path.basename(path))[0] + ".marshal")


def load_state(path: str) -> dict[str, Any]:
    """The launcher's JSON state file at `path`, parsed; through a `marshal` copy when it is current.

    The copy (`<state dir>/../mounts-cache/<name>.marshal`, private like the state file) is keyed by
    the JSON file's inode, size and mtime, so a rewritten state file is parsed again; a copy that
    cannot be read or written is just not used. Raises what `open` and `json.loads` raise for the
    JSON file itself.
    """
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        key = (info.st_ino, info.st_size, info.st_mtime_ns)
        cache = state_cache(path)
        try:
            with open(cache, "rb") as c:
                cached_key, cached = marshal.load(c)
            if cached_key == key and isinstance(cached, dict):
                return cached
        except (OSError, EOFError, ValueError, TypeError):
            pass
        import json  # only when the state file changed: json loads `re`, slower than a small recipe

        data: dict[str, Any] = json.loads(f.read())
    if isinstance(data, dict):
        try:
            os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
            temporary = f"{cache}.{os.getpid()}.tmp"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "wb") as c:
                marshal.dump((key, data), c)
            os.replace(temporary, cache)  # whole or not at all, with recipes reading it in parallel
        except (OSError, ValueError):
            pass
    return data


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
        """holdings[namespace path][node] = bytes, for `gmountpy.jobs.placement.choose_node`.

        Paths are relative to `cwd` (default: the current directory); paths
        outside this cluster's mounts are not in the namespace and are left
        out; a path no node holds maps to {}. A directory stands for every
        file below it, as in `Cluster.place`. Holders come from the mount's
        `user.gmount.where` xattr; each is credited with the size the mount
        shows (replicas have their source's size).
        """
        base = os.getcwd() if cwd is None else cwd
        files: dict[str, tuple[str, int]] = {}  # namespace path -> (path here or "" if absent, size)
        for path in paths:
            absolute = os.path.join(base, path)
            found = self.node_for_path(absolute)
            if found is not None:
                self._collect(absolute, found[1], files)
        # Every `where` asks every node: read them PARALLEL_READS at a time, so a recipe with many
        # prerequisites waits about one round trip per batch, not one per prerequisite.
        holders = _read_where([absolute for absolute, _ in files.values()])
        return {ns_path: {node: size for node in held if node in self.nodes}
                for (ns_path, (_, size)), held in zip(files.items(), holders, strict=True)}

    def _collect(self, absolute: str, ns_path: str, files: dict[str, tuple[str, int]]) -> None:
        """Add the files `absolute` stands for (itself, or every file below a directory) to `files`."""
        if ns_path in files:
            return
        try:
            info = os.stat(absolute)
        except OSError:
            files[ns_path] = ("", 0)  # no such file: held by no node
            return
        if stat.S_ISDIR(info.st_mode):
            try:
                names = sorted(os.listdir(absolute))
            except OSError:
                names = []
            for name in names:
                self._collect(os.path.join(absolute, name), posixpath.join(ns_path, name), files)
            return
        files[ns_path] = (absolute, info.st_size)


def _where(path: str) -> list[str]:
    """The nodes holding the file at `path` (inside a mount), from its `user.gmount.where` xattr."""
    if not path:
        return []
    try:
        return os.getxattr(path, WHERE_XATTR).decode().split()
    except OSError:
        return []


def _read_where(paths: list[str]) -> list[list[str]]:
    """`_where` of every path, up to PARALLEL_READS at once (threads: the calls wait on the daemons)."""
    if len(paths) < 2:
        return [_where(path) for path in paths]
    import threading  # only for more than one read: most of a recipe's cost is its start

    holders: list[list[str]] = [[] for _ in paths]
    workers = min(PARALLEL_READS, len(paths))

    def read(first: int) -> None:
        for i in range(first, len(paths), workers):
            holders[i] = _where(paths[i])

    threads = [threading.Thread(target=read, args=(first,), daemon=True) for first in range(1, workers)]
    for thread in threads:
        thread.start()
    read(0)
    for thread in threads:
        thread.join()
    return holders


def find(path: str) -> tuple[MountedCluster, str, str] | None:
    """The running cluster, node and namespace path for a path inside a mount on this machine."""
    try:
        names = sorted(f for f in os.listdir(state_dir()) if f.endswith(".json") and not f.endswith(".tls.json"))
    except FileNotFoundError:
        return None
    for name in names:
        try:
            cluster = MountedCluster(load_state(os.path.join(state_dir(), name)))
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
