"""Four real nodes in one trio run, without FUSE: export + service + RPC server + peers + locator + namespace.

Wired as `gmountpy.node.daemon` wires a node, on 127.0.0.1 with port 0. The
demo topology: site tsukuba = n1, n2; site hongo = n3, n4; 14 ms apart. Each
node's server runs in its own cancel scope so a test can stop it, and counts
the requests it serves (remote requests only: a node calls itself directly).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from gmountpy._trio import open_nursery
from gmountpy.cluster.config import ClusterSpec, Tuning, parse_spec
from gmountpy.cluster.overlay import Overlay
from gmountpy.node.export import Export
from gmountpy.node.index import DirectoryIndex, ExportWatcher, Homes, IndexLocator
from gmountpy.node.locator import FloodLocator, Locator
from gmountpy.node.namespace import Namespace
from gmountpy.node.peers import PeerAddress, PeerPool
from gmountpy.node.service import NodeService
from gmountpy.protocol import messages as msg
from gmountpy.protocol import rpc

SECRET = b"harness secret, 32 bytes long..."
SITES = {"tsukuba": ["n1", "n2"], "hongo": ["n3", "n4"]}
LINKS = [("tsukuba", "hongo", 14.0)]


def make_spec(base: Path, sites: dict[str, list[str]] = SITES,
              links: list[tuple[str, str, float]] = LINKS) -> ClusterSpec:
    return parse_spec({
        "name": "harness",
        "defaults": {"export": f"{base}/{{node}}/export", "mountpoint": f"{base}/{{node}}/mnt"},
        "sites": {site: {"nodes": nodes} for site, nodes in sites.items()},
        "links": [{"sites": [a, b], "rtt_ms": rtt} for a, b, rtt in links],
    })


@dataclass
class Node:
    name: str
    site: str
    root: Path
    export: Export
    service: NodeService
    served: Counter[str] = field(default_factory=Counter)
    #: ids of the server-side sessions seen, one per incoming connection
    sessions: set[int] = field(default_factory=set)
    #: op (or "op@peer": only that peer's requests) -> seconds the server waits before
    #: answering it (a slow or stuck node)
    delay: dict[str, float] = field(default_factory=dict)
    #: op -> errno the server answers it with (a holder whose disk or permissions fail)
    fail: dict[str, int] = field(default_factory=dict)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: with a directory index: told of files put straight on disk, so that homes list their
    #: directories again ("as if it was there before the cluster"; a live export is rescanned later)
    on_disk_change: Callable[[str], None] | None = None
    address: PeerAddress | None = None
    pool: PeerPool = field(init=False)
    locator: Locator = field(init=False)
    index: DirectoryIndex | None = None  # with lookup = "index" or "central": what this node keeps as a home
    watcher: ExportWatcher | None = None  # and what watches its export (scan() by hand: no background task)
    namespace: Namespace = field(init=False)
    #: the service's table of extra operations (a test replaces a node's index as a restart would)
    extra: msg.Operations = field(default_factory=dict)

    async def dispatch(self, session: rpc.Session, op: str, args: list[Any]) -> Any:
        self.served[op] += 1
        self.sessions.add(id(session))
        wait = self.delay.get(f"{op}@{session.peer}", self.delay.get(op))
        if wait is not None:
            await trio.sleep(wait)
        if op in self.fail:
            raise OSError(self.fail[op], f"{os.strerror(self.fail[op])} (injected on {self.name})")
        return await self.service.dispatch(session, op, args)

    async def serve(self, task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        with self.scope:
            await rpc.serve("127.0.0.1", 0, self.dispatch, secret=SECRET, name=self.name, task_status=task_status)

    def path(self, rel: str) -> Path:
        """Where a namespace path lives on this node's disk."""
        return self.root / rel.lstrip("/")

    def put(self, rel: str, data: bytes = b"") -> Path:
        """Write a file straight into this node's export (as if it was there before the cluster)."""
        path = self.path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if self.on_disk_change is not None:
            self.on_disk_change(rel)
        return path

    def mkdir(self, rel: str) -> Path:
        path = self.path(rel)
        path.mkdir(parents=True, exist_ok=True)
        if self.on_disk_change is not None:
            self.on_disk_change(rel)
        return path

    def has(self, rel: str) -> bool:
        return os.path.lexists(self.path(rel))


@dataclass
class Cluster:
    spec: ClusterSpec
    overlay: Overlay
    nodes: dict[str, Node]
    nursery: trio.Nursery

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def holders(self, rel: str) -> list[str]:
        """The nodes whose export has `rel`, looked at on disk."""
        return [name for name, node in self.nodes.items() if node.has(rel)]

    def served(self, op: str) -> dict[str, int]:
        return {name: node.served[op] for name, node in self.nodes.items()}

    def reset_counts(self) -> None:
        for node in self.nodes.values():
            node.served.clear()

    def stop(self, name: str) -> None:
        """Stop a node's server: its port refuses connections and open connections close."""
        self.nodes[name].scope.cancel()

    async def restart(self, name: str) -> PeerAddress:
        """Serve the node again, on a new port (as a restarted daemon would); returns the new address."""
        node = self.nodes[name]
        node.scope.cancel()
        node.scope = trio.CancelScope()
        listeners = await self.nursery.start(node.serve)
        host, port = listeners[0].socket.getsockname()[:2]
        node.address = PeerAddress(host, port)
        return node.address

    def addresses(self) -> dict[str, PeerAddress]:
        return {name: node.address for name, node in self.nodes.items() if node.address is not None}

    def forget_caches(self) -> None:
        for node in self.nodes.values():
            node.locator.forget_all()


def _forget_indexes(nodes: dict[str, Node]) -> None:
    """Every home lists its directories again (parents of the new file may be new too)."""
    for node in nodes.values():
        if node.index is not None:
            node.index.forget(["/"])


def _created_on(nodes: dict[str, Node], name: str) -> Any:
    """The daemon's `created` operation (another node created a path), wired as daemon.py wires it."""
    async def created(request: msg.Created) -> None:
        await nodes[name].namespace.created_elsewhere(request.path, request.is_dir)
    return created


@asynccontextmanager
async def open_cluster(
    base: Path,
    *,
    ttl: float = 60.0,
    negative_ttl: float = 60.0,
    rpc_timeout: float = 2.0,
    connect_timeout: float = 1.0,
    retry_after: float = 2.0,
    lookup: str | None = None,
    split_entries: int = 0,
) -> AsyncIterator[Cluster]:
    """Bring up the four nodes; everything is closed when the block ends.

    The default TTLs are long so that tests are deterministic; tests of expiry
    pass short ones or jump a MockClock.
    """
    lookup = lookup or os.environ.get("GMOUNT_TEST_LOOKUP") or Tuning().lookup  # the env: a suite under another locator
    spec = make_spec(base)
    overlay = Overlay(spec)
    nodes: dict[str, Node] = {}
    extras: dict[str, msg.Operations] = {}
    for name, node_spec in spec.nodes.items():
        os.makedirs(node_spec.export)
        export = Export(node_spec.export)
        info = {"node": name, "site": node_spec.site, "cluster": spec.name, "export": node_spec.export}
        extra = extras[name] = {msg.Created: _created_on(nodes, name)}
        nodes[name] = Node(name, node_spec.site, Path(export.root), export, NodeService(export, info, extra),
                           extra=extra)
    try:
        async with open_nursery() as nursery:
            for node in nodes.values():
                listeners = await nursery.start(node.serve)
                host, port = listeners[0].socket.getsockname()[:2]
                node.address = PeerAddress(host, port)
            addresses = {name: node.address for name, node in nodes.items() if node.address is not None}
            sites = {name: node.site for name, node in nodes.items()}
            for name, node in nodes.items():
                node.pool = PeerPool(name, node.service, SECRET, nursery, rpc_timeout=rpc_timeout,
                                     connect_timeout=connect_timeout, retry_after=retry_after)
                node.pool.set_peers(addresses)
                if lookup == "flood":
                    node.locator = FloodLocator(node.pool, overlay.lookup_tiers(name), ttl=ttl,
                                                negative_ttl=negative_ttl)
                else:  # as daemon.py wires it
                    homes = Homes(tuple(nodes), sites, "n1" if lookup == "central" else None)
                    node.index = DirectoryIndex(node.pool, overlay.lookup_order(name),
                                                lease=IndexLocator.lease_for(negative_ttl), homes=homes,
                                                split_entries=split_entries)
                    extras[name].update(node.index.operations())
                    node.watcher = ExportWatcher(node.pool, homes)
                    extras[name].update(node.watcher.operations())
                    locator = IndexLocator(node.pool, overlay.lookup_tiers(name), homes, ttl=ttl,
                                           negative_ttl=negative_ttl, index=node.index)
                    extras[name].update(locator.operations())
                    node.locator = locator
                    node.on_disk_change = lambda rel: _forget_indexes(nodes)
                node.namespace = Namespace(name, sites, node.export, node.pool, node.locator, nursery)
                node.service.on_created = node.namespace.created_by_put  # as daemon.py wires it
            try:
                yield Cluster(spec, overlay, nodes, nursery)
            finally:
                with trio.CancelScope(shield=True):
                    for node in nodes.values():
                        await node.pool.aclose()
                nursery.cancel_scope.cancel()
    finally:
        for node in nodes.values():
            node.export.close()


async def read_file(namespace: Namespace, path: str, size: int = 1 << 20) -> bytes:
    handle = await namespace.open(path, os.O_RDONLY)
    try:
        return await namespace.read(handle, 0, size)
    finally:
        await namespace.release(handle)
