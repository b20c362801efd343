"""The requests a whole node answers, beyond its export: the node's view of the namespace, its
peers, its certificate, its statistics, and stopping it.

NodeService answers what concerns the export alone; these need the parts
the daemon builds around it (namespace, peer pool, locator, index, TLS), so
they live in one object of their own, whose operations the service serves
(`service.add_operations(control.operations())`): each method takes its typed request
(gmountpy.protocol.messages.control), decoded by the service. The daemon only wires.
"""

from __future__ import annotations

import errno
import logging
import os
import ssl
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, cast

import trio

from ..cluster import registry
from ..cluster.config import ClusterSpec
from ..cluster.overlay import Overlay
from ..protocol import messages as msg
from ..protocol import rpc
from ..protocol.messages import HolderRow, JobRow, LsEntry, LsReply, StageReply
from ..protocol.tls import NodeCredentials, certificate_problem, expires, load_credentials
from . import readahead
from .export import off_loop
from .index import DirectoryIndex, IndexLocator
from .locator import Locator
from .namespace import Namespace
from .peers import PeerAddress, PeerPool
from .service import NodeService
from .staging import stage_file

if TYPE_CHECKING:
    from .bypass import BypassServer
    from .fuse import GmountOperations

log = logging.getLogger(__name__)


class NodeControl:
    """Node-wide operations (`where`, `ls`, `remove`, `stage`, `set_peers`, `renew_tls`, `stats`, `jobs`,
    `shutdown`, `created`)."""

    def __init__(self, me: str, spec: ClusterSpec, overlay: Overlay, *, service: NodeService, pool: PeerPool,
                 locator: Locator, index: DirectoryIndex | None, namespace: Namespace,
                 limits: rpc.RequestLimits, server_tls: ssl.SSLContext | None = None,
                 client_tls: ssl.SSLContext | None = None, credentials: NodeCredentials | None = None) -> None:
        self.me = me
        self.spec = spec
        self.overlay = overlay
        self.service = service
        self.pool = pool
        self.locator = locator
        self.index = index
        self.namespace = namespace
        self.limits = limits
        self.server_tls = server_tls
        self.client_tls = client_tls  # the node presents its certificate to its peers too
        self.credentials = credentials
        #: The FUSE front end, once mounted (its inode and open-file counts go into `stats`).
        self.mount: GmountOperations | None = None
        #: The jobs' bypass channel, when served (its counters go into `stats`).
        self.bypass: BypassServer | None = None
        #: Set by the `shutdown` request (and by the daemon on SIGTERM/SIGINT): time to unmount.
        self.shutdown = trio.Event()

    def operations(self) -> msg.Operations:
        return msg.operations(self.where, self.ls, self.remove, self.stage, self.set_peers, self.renew_tls,
                              self.stats, self.jobs, self.stop, self.created)

    async def where(self, request: msg.Where) -> list[HolderRow]:
        """Every holder of `path`, nearest first, as this node sees them."""
        path = request.path
        holders = await self.namespace.where(path)
        return [{
            "node": loc.node,
            "site": self.overlay.site_of(loc.node),
            "size": loc.attr.size,
            "mtime_ns": loc.attr.mtime_ns,
            "mode": loc.attr.mode,
            "export_path": os.path.join(self.spec.node(loc.node).export, path.lstrip("/")),
            "rtt_ms": self.overlay.rtt(self.me, loc.node),
            "replica_of": loc.replica_of,
        } for loc in holders]

    async def ls(self, request: msg.Ls) -> LsReply:
        """The merged listing as this node's mount shows it, with every holder of each name."""
        listing = await self.namespace.merged_listing(request.path)
        return LsReply(tuple(LsEntry(e.name, e.location.node, e.location.attr, e.holders)
                             for e in listing.entries), tuple(listing.unreachable))

    async def remove(self, request: msg.Remove) -> list[str]:
        """`path` removed from every holder as this node's mount removes it; the nodes it was on."""
        path = request.path
        holders = await self.namespace.where(path)
        if not holders:
            raise FileNotFoundError(errno.ENOENT, f"no node holds {path}")
        is_dir = holders[0].attr.is_dir
        if is_dir:
            await self.namespace.rmdir(path)
        else:
            await self.namespace.unlink(path)
        return [loc.node for loc in holders if loc.attr.is_dir == is_dir and loc.replica_of is None]

    async def created(self, request: msg.Created) -> None:
        """A peer created a name: forget "not found" for it."""
        await self.namespace.created_elsewhere(request.path, request.is_dir)

    async def stage(self, request: msg.Stage) -> StageReply:
        return await stage_file(self.namespace, self.service, request.path)

    async def set_peers(self, request: msg.SetPeers) -> None:
        """A node was (re)started elsewhere: learn its address and forget cached misses."""
        self.pool.set_peers({name: PeerAddress(host, port) for name, (host, port) in request.table.items()})
        self.locator.forget_all()
        if self.index is not None:
            self.index.forget_all()  # a node restarted: its export may have changed while it was down

    async def renew_tls(self, request: msg.RenewTls) -> str:
        """`gmount up` reissued our certificate: present it on connections from now on."""
        cert, key = request.cert, request.key
        if self.server_tls is None or self.credentials is None:
            raise OSError(errno.EINVAL, f"node {self.me} does not use TLS")
        fresh = NodeCredentials(self.credentials.ca, cert, key)
        problem = certificate_problem(fresh, self.me, self.pool.secret)
        if problem is not None:
            raise OSError(errno.EINVAL, problem)
        load_credentials(self.server_tls, fresh)
        if self.client_tls is not None:
            load_credentials(self.client_tls, fresh)
        self.credentials = fresh
        log.info("node %s now presents a renewed certificate, valid until %s", self.me, expires(cert))
        return str(expires(cert))

    async def stats(self, request: msg.Stats) -> dict[str, Any]:
        """Caches, messages, handles and limits of this node, for tests and benchmarks."""
        s = self.locator.statistics()
        lookup: dict[str, Any] = {"lookup": self.spec.tuning.lookup,
                                  "messages_sent": dict(self.service.counters.messages)}
        if isinstance(self.locator, IndexLocator):
            lookup["fallbacks"] = self.locator.fallbacks
        if self.index is not None:
            lookup["index"] = asdict(self.index.statistics())
        mount: dict[str, Any] = {}
        if self.mount is not None:
            mount = {"inodes": len(self.mount.inodes), "open_files": len(self.mount._files)}
            if self.mount.passthrough is not None:
                mount.update(self.mount.passthrough.statistics())
        if self.bypass is not None:
            mount["bypass"] = dict(self.bypass.served)
        usage = self.service.usage
        return {**lookup, "node": self.me, "pid": os.getpid(), **mount, "cache_hits": s.hits,
                "cache_misses": s.misses, "negative_hits": s.negative_hits, "remote_queries": s.remote_queries,
                # against the [tuning] limits: what peers hold here, and what this node holds
                "peer_handles": usage.handles, "peer_listings": usage.listings,
                "requests_in_progress": self.limits.in_progress, "requests_refused": self.limits.refused,
                "readahead_bytes": readahead.NODE_BUDGET.used}

    async def jobs(self, request: msg.Jobs) -> list[JobRow]:
        """The jobs started on this node's machine for its cluster and still running (make, Snakemake, the
        API register them: gmountpy.cluster.registry), oldest first, whichever node each runs on."""
        return cast("list[JobRow]", await off_loop(registry.running, self.spec.name))

    async def stop(self, request: msg.Shutdown) -> None:
        self.shutdown.set()
