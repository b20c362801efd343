"""fsspec file system for gmount clusters: read and write cluster data without a local mount.

URLs name the cluster in the host part and a namespace path after it::

    gmount://demo/data/a.csv             cluster "demo", path /data/a.csv
    gmount:///data/a.csv                 the `cluster=` option, else the cluster whose mount holds
                                         the working directory, else the only running cluster

so ``pandas.read_csv("gmount://demo/data/a.csv")`` works from any process of
the user who started the cluster (the cluster's secret is read from the
launcher's state). Storage options:

``cluster``
    a running cluster's name, its cluster file, or a path inside a mount;
    taken from the URL's host part when given there.
``node``
    the node the file system asks from (default: the node whose mount this
    process runs in, as a gmount job or Dask worker does; else the cluster's
    first node). Lookups, listings and "nearest" follow that node's view: its
    own files first, then its site, then other sites by RTT -- as its mount would.

Inside a node's mount -- a process started by gmount on a node (`run`,
`spawn`, a Dask worker: GMOUNT_CLUSTER and GMOUNT_NODE set) whose mount is on
this machine -- files are read through that mount: the node's own files from
its disk, others by the mount from their holder (and counted in the node's
`read_local` / `read_remote`), instead of over RPC from this process.

A file system instance keeps one authenticated connection per node it talks
to, on a trio loop of its own (a daemon thread), for its whole life: every
call and every open file shares them.

Reading: ``open`` looks the path up, then opens it on its nearest holder and
keeps that handle until ``close``; every range is read through it, directly
from that node. So a file is bound at open (close-to-open): one replaced or
rewritten on its node meanwhile is still read whole, as it was when opened --
never bytes of two versions. ``info`` carries ``node`` (the holder read
from), ``site``, ``export_path`` and ``locations``: every holder, nearest
first. Listings are the merge of every node's directory, like the mount.

Writing (``open(..., "wb")``, ``pipe``, ``put``, ``touch``, ``cp``) replaces
a file on the node that holds it, and creates a new one on ``node``, as a
write through that node's mount would. The bytes stream into a hidden
temporary file on that node as the buffer fills; committing checks its size
and SHA-256 and renames it into place, so readers see the old file or the
whole new one, never part of it. A file commits when it is closed, or --
inside ``with fs.transaction:`` or opened with ``autocommit=False`` -- when
the transaction ends (``commit()``/``discard()`` by hand otherwise). An
exception inside ``with fs.open(..., "wb") as f:`` discards the write.
``mkdir`` makes the directory on ``node``; ``rm`` removes a file from every
node holding it (a directory: from every node that has it, once empty).
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import re
import threading
import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import IO, Any, Protocol, TypeVar

import trio
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import stringify_path

from .._sync import blocking
from ..cluster import state as state_store
from ..cluster.state import ClusterState, load_secret
from ..errors import GmountError, NodeUnavailable
from ..protocol import messages as msg
from ..protocol.client import ClusterClient, open_client
from .files import PutPlan, finish_put, plan_put, put_open
from .requests import Requests, close_quietly, read_handle, write_handle
from .results import Entry, FileLocations
from .view import ClusterView

__all__ = ["GmountFile", "GmountFileSystem"]

PROTOCOL = "gmount"
T = TypeVar("T")

#: A daemon's temporary file of a write or staging in progress (`.NAME.gmount-put-XXXXXXXX`): a node's
#: export scan can list one for a moment before it is renamed into place; it is never a user's file.
_IN_FLIGHT = re.compile(r"\..+\.gmount-(put|stage)-[0-9a-f]{8}\Z", re.DOTALL)


class ClusterLike(Protocol):
    """What `GmountFileSystem(cluster=...)` takes from a `gmountpy.Cluster`: its name and home node."""

    @property
    def name(self) -> str: ...

    @property
    def home(self) -> str: ...


class Session:
    """One ClusterClient on a trio loop of its own (a daemon thread), shared by every call and open file.

    Calls come from any thread (also one running asyncio, as in Jupyter:
    see gmountpy._sync) and run concurrently on the loop; each node has one
    connection, opened at its first use.
    """

    def __init__(self, state: ClusterState, secret: bytes) -> None:
        self.state = state
        self.secret = secret
        self.pid = os.getpid()
        self._client: ClusterClient | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"gmount-fsspec-{state.name}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    def _serve(self) -> None:
        async def main() -> None:
            self._stop = trio.Event()
            # the nursery: requests sent without waiting (`send`), finished before the connections close
            async with open_client(self.state, name="gmount-fsspec", secret=self.secret) as client, \
                    trio.open_nursery() as nursery:
                self._client, self._nursery = client, nursery
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()

        try:
            trio.run(main)
        except BaseException as exc:  # reported to the constructor, or the loop ended: calls say so
            self._failure = exc
        finally:
            self._client = None
            self._ready.set()

    @property
    def alive(self) -> bool:
        return self._client is not None and self.pid == os.getpid()

    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `func(client, *args)` on the session's loop and return its result (from any thread but the loop's)."""
        client, token = self._client, self._token
        if client is None or token is None or self.pid != os.getpid():
            raise ConnectionResetError(errno.ECONNRESET, f"the connections to cluster {self.state.name!r} "
                                                         "were closed")
        if threading.current_thread() is self._thread:
            raise RuntimeError("a gmount:// call from the file system's own event loop would wait for itself")
        try:
            result: T = blocking(trio.from_thread.run, func, client, *args, trio_token=token)
            return result
        except trio.RunFinishedError:
            raise ConnectionResetError(errno.ECONNRESET, f"the connections to cluster {self.state.name!r} "
                                                         "were closed") from None
        except BaseExceptionGroup as group:  # several concurrent requests failed: the first says why
            raise _first_leaf(group) from None

    def send(self, node: str, request: msg.Close | msg.PutAbort) -> None:
        """Release a handle without waiting for the answer (also from a finalizer, on any thread)."""
        client, token, nursery = self._client, self._token, self._nursery
        if client is None or token is None or nursery is None or self.pid != os.getpid():
            return  # the connection is gone, and the handle with it
        try:
            token.run_sync_soon(nursery.start_soon, close_quietly, client, node, request)
        except trio.RunFinishedError:
            pass

    def close(self) -> None:
        """Close every connection (open handles die with them) and end the loop."""
        stop, token = self._stop, self._token
        if stop is None or token is None or self.pid != os.getpid() or not self._thread.is_alive():
            return
        try:
            token.run_sync_soon(stop.set)  # never waits: also safe from a finalizer on the loop's own thread
        except trio.RunFinishedError:
            return
        if threading.current_thread() is not self._thread:
            self._thread.join(10)


class GmountFileSystem(AbstractFileSystem):
    """fsspec access to a running gmount cluster over its daemons' RPC (see the module doc)."""

    protocol = PROTOCOL
    root_marker = "/"

    def __init__(self, cluster: str | os.PathLike[str] | ClusterLike | None = None, node: str | None = None,
                 **kwargs: Any) -> None:
        home: str | None = None
        if cluster is not None and not isinstance(cluster, (str, os.PathLike)):
            home, cluster = cluster.home, cluster.name
        found = state_store.resolve(os.fspath(cluster) if cluster is not None else None, paths=[os.getcwd()])
        #: (node, mountpoint) when this process runs inside a node's mount on this machine: reads go through it
        self.mount = _mount_here(found.state)
        default = self.mount[0] if self.mount is not None else (home if home is not None else found.node)
        view = ClusterView(found.state, node if node is not None else default)
        super().__init__(cluster=found.state.name, node=view.home, **kwargs)
        #: the cluster's name (the `cluster` storage option, resolved)
        self.cluster: str = found.state.name
        #: the node this file system asks from
        self.node: str = view.home
        self._requests = Requests(view)
        self._lock = threading.Lock()
        self._session = Session(found.state, load_secret(found.state.name))
        self._closer = weakref.finalize(self, self._session.close)  # its thread and connections go with it

    # -- the connections -----------------------------------------------------------

    @property
    def session(self) -> Session:
        """The live session; a new one after a fork (the parent's loop does not exist in a child)."""
        with self._lock:
            if not self._session.alive:
                state = state_store.load(self.cluster)
                if state is None:
                    raise GmountError(f"cluster {self.cluster!r} is no longer running: start it with `gmount up`")
                self._replace(Session(state, load_secret(state.name)))
            return self._session

    def _replace(self, session: Session) -> None:
        self._closer.detach()
        self._session = session
        self._closer = weakref.finalize(self, session.close)

    def _refresh(self, failed: Session) -> bool:
        """After a node did not answer: if the cluster was restarted (new ports or secret), a new session."""
        with self._lock:
            if self._session is not failed and self._session.alive:
                return True  # another thread already refreshed it
            state = state_store.load(self.cluster)
            if state is None:
                raise GmountError(f"cluster {self.cluster!r} is no longer running: start it with `gmount up`")
            secret = load_secret(state.name)
            moved = secret != failed.secret or any(
                (record.host, record.port) != (old.host, old.port)
                for name, record in state.nodes.items()
                if (old := failed.state.nodes.get(name)) is not None)
            if not moved:
                return False
            failed.close()
            self._replace(Session(state, secret))
            return True

    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `func(client, *args)` on this file system's connections.

        A node that does not answer because the cluster was restarted (new ports, a new secret)
        is asked again once, over new connections; files open before that cannot be read on.
        """
        session = self.session
        try:
            return session.call(func, *args)
        except NodeUnavailable:
            if not self._refresh(session):
                raise
        return self.session.call(func, *args)

    # -- paths -----------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = stringify_path(path)
        if text.startswith(PROTOCOL + "://"):
            rest = text[len(PROTOCOL) + 3:]
            text = rest if rest.startswith("/") else "/" + rest.partition("/")[2]
        elif text.startswith(PROTOCOL + "::"):
            text = text[len(PROTOCOL) + 2:]
        return posixpath.normpath("/" + text.lstrip("/"))

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        text = stringify_path(path)
        if text.startswith(PROTOCOL + "://"):
            host = text[len(PROTOCOL) + 3:].partition("/")[0]
            if host:
                return {"cluster": host}
        return {}

    def unstrip_protocol(self, name: str) -> str:
        return f"{PROTOCOL}://{self.cluster}{self._strip_protocol(name)}"

    # -- metadata ----------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        listing = self.call(self._requests.listing, self.node, path)
        if len(listing.entries) == 1 and listing.entries[0].path == path:
            entries = [self.info(path)]  # `ls` of a file: that file, with all its details
        else:
            entries = [_entry_info(e) for e in listing.entries if not _IN_FLIGHT.match(e.name)]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        found = self.call(self._requests.where, self.node, path)
        if not found.holders:
            raise FileNotFoundError(errno.ENOENT, f"no node of cluster {self.cluster!r} holds {path}", path)
        return _info(found)

    def modified(self, path: str) -> datetime:
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=UTC)

    # -- data ------------------------------------------------------------------------

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> GmountFile | IO[bytes]:
        path = self._strip_protocol(path)
        if mode not in ("rb", "wb", "xb"):
            raise NotImplementedError(f"gmount:// files open as 'rb', 'wb' or 'xb', not {mode!r} "
                                      "(to append, write through a node's mount)")
        if mode == "rb" and self.mount is not None:
            return open(self._in_mount(path), "rb")  # noqa: SIM115 -- the caller closes it, as any fsspec file
        if mode == "xb" and self.exists(path):
            raise FileExistsError(errno.EEXIST, f"{path} exists", path)
        return GmountFile(self, path, mode, block_size, autocommit, cache_options=cache_options, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """Bytes [start, end) (negative: from the end) read from the nearest holder, through one handle."""
        path = self._strip_protocol(path)
        if self.mount is not None:
            with open(self._in_mount(path), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                first = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
                stop = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
                f.seek(first)
                return f.read(max(0, stop - first))

        async def read(client: ClusterClient) -> bytes:
            holder, opened = await _open_nearest(client, self._requests, self.node, path)
            try:
                size = opened.attr.size
                first = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
                stop = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
                return await read_handle(client, holder, opened.handle, first, max(first, stop))
            finally:
                await close_quietly(client, holder, msg.Close(opened.handle))

        return self.call(read)

    def put_file(self, lpath: str, rpath: str, callback: Any = None, mode: str = "overwrite", **kwargs: Any) -> None:
        """Upload a local file (streamed, committed like any write), keeping its permission bits."""
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        if mode == "create" and self.exists(rpath):
            raise FileExistsError(errno.EEXIST, f"{self._strip_protocol(rpath)} exists", rpath)
        with open(lpath, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            if callback is not None:
                callback.set_size(size)
            with self.open(rpath, "wb", permissions=os.fstat(source.fileno()).st_mode & 0o7777, **kwargs) as target:
                while piece := source.read(self.blocksize):
                    target.write(piece)
                    if callback is not None:
                        callback.relative_update(len(piece))

    def _in_mount(self, path: str) -> str:
        assert self.mount is not None
        return os.path.join(self.mount[1], self._strip_protocol(path).lstrip("/"))

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy through this process, one handle on each side (the source as it was when opened).

        A directory is made (recursive copies name every directory they cross)."""
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        with self.open(path1, "rb") as source, self.open(path2, "wb", **kwargs) as target:
            while piece := source.read(source.blocksize):
                target.write(piece)

    # -- the namespace ---------------------------------------------------------------

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if not create_parents and not self.isdir(posixpath.dirname(path)):
            raise FileNotFoundError(errno.ENOENT, f"{posixpath.dirname(path)} is not a directory", path)
        self._mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if exist_ok and self.isdir(path):
            return
        self._mkdir(path)

    def _mkdir(self, path: str) -> None:
        async def make(client: ClusterClient) -> None:
            found = await self._requests.where(client, self.node, path)
            if found.nearest is not None:
                raise FileExistsError(errno.EEXIST, f"{path} exists (on node {found.nearest.node})", path)
            await client.ask(self.node, msg.Mkdir(path, 0o755))  # (with its parents) in this node's export
            await client.ask(self.node, msg.Rescan())  # its homes hear of it now, not at the next scan

        self.call(make)

    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)

        async def remove(client: ClusterClient) -> None:
            # as this node's mount removes it: every holder, and the directory's home, before the reply
            await client.ask(self.node, msg.Remove(path))

        self.call(remove)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rmdir(self, path: str) -> None:
        path = self._strip_protocol(path)
        if not self.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, f"{path} is not a directory", path)
        self.rm_file(path)


class GmountFile(AbstractBufferedFile):
    """A gmount:// file open for reading (bound to one holder's handle at open) or writing (see the module doc)."""

    def __init__(self, fs: GmountFileSystem, path: str, mode: str, block_size: Any, autocommit: bool,
                 cache_options: Any = None, **kwargs: Any) -> None:
        self._session = fs.session
        self.holder: str | None = None   # reading: the node whose handle is read; writing: the target
        self._handle: int | None = None
        self._digest = hashlib.sha256()
        self._plan: PutPlan | None = None
        self._sent = 0
        self._state = "open"             # writing: "open", then "committed" or "discarded"
        self._permissions = int(kwargs.pop("permissions", 0o644))
        sized: dict[str, Any] = {}
        if mode == "rb":
            self.holder, opened = fs.call(_open_nearest, fs._requests, fs.node, path)
            self._session = fs.session  # the one the handle was opened on
            self._handle = opened.handle
            sized = {"size": opened.attr.size}
        super().__init__(fs, path, mode, block_size if block_size is not None else "default", autocommit,
                         cache_options=cache_options, **sized, **kwargs)

    # -- reading: every range through the handle bound at open ----------------------

    def _fetch_range(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        assert self.holder is not None and self._handle is not None, "only files opened for reading fetch"
        return self._through_handle(read_handle, self.holder, self._handle, start, min(end, self.size))

    def _through_handle(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        try:
            return self._session.call(func, *args)
        except (ConnectionResetError, NodeUnavailable) as exc:
            raise OSError(errno.EIO, f"{self.path}: the connection to node {self.holder} was lost while the file "
                                     f"was open ({exc}); open it again") from None

    # -- writing: a verified put on the target node, committed at close or transaction end -----------

    def _initiate_upload(self) -> None:
        fs: GmountFileSystem = self.fs

        async def start(client: ClusterClient) -> tuple[PutPlan, int]:
            plan = await plan_put(fs._requests, client, fs.node, self.path, None)
            return plan, await put_open(client, plan, self._permissions)

        self._plan, self._handle = fs.call(start)
        self.holder = self._plan.target
        self._session = fs.session

    def _upload_chunk(self, final: bool = False) -> bool:
        assert self.holder is not None and self._handle is not None, "the put starts before the first chunk"
        self._sent += self._through_handle(write_handle, self.holder, self._handle, self._sent,
                                           [self.buffer.getvalue()], self._digest)
        if final and self.autocommit:
            self.commit()
        return True

    def commit(self) -> None:
        """Check what landed (size and SHA-256) and rename it into place; other copies of the name go."""
        if not self.closed and self._state == "open":
            self.close()  # the rest of the buffer goes first (not committed: autocommit is off)
        if self._state != "open" or self._handle is None or self._plan is None:
            return  # nothing written (discarded, or never flushed), or committed already
        self._state = "committed"
        self._through_handle(finish_put, self._plan, self._handle, self._sent, self._digest.hexdigest())

    def discard(self) -> None:
        """Give up the write: the temporary file goes, the name keeps what it had."""
        if self._state != "open":
            return
        self._state = "discarded"
        if self._handle is not None and self.holder is not None:
            self._session.send(self.holder, msg.PutAbort(self._handle))

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None and self.writable():
            self.discard()  # a write that failed half-way must not replace the file
            self.closed = True
            return
        self.close()

    # -- closing -----------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            if self.mode == "rb" and self._handle is not None and self.holder is not None:
                handle, self._handle = self._handle, None
                self._session.send(self.holder, msg.Close(handle))


def _mount_here(state: ClusterState) -> tuple[str, str] | None:
    """(node, mountpoint) when this process runs on a node of the cluster whose mount is on this machine."""
    node = os.environ.get("GMOUNT_NODE")
    if os.environ.get("GMOUNT_CLUSTER") != state.name or node is None or node not in state.spec.nodes:
        return None
    mountpoint = state.spec.nodes[node].mountpoint
    return (node, mountpoint) if os.path.ismount(mountpoint) else None


async def _open_nearest(client: ClusterClient, requests: Requests, asking: str,
                        path: str) -> tuple[str, msg.OpenReply]:
    """Open `path` read-only on its nearest holder as `asking` sees it: (holder, the open handle)."""
    for _ in range(3):
        found = await requests.where(client, asking, path)
        nearest = found.nearest
        if nearest is None:
            raise FileNotFoundError(errno.ENOENT, f"no node holds {path}", path)
        if nearest.is_dir:
            raise IsADirectoryError(errno.EISDIR, f"{path} is a directory (on node {nearest.node})", path)
        try:
            return nearest.node, await client.ask(nearest.node, msg.Open(path, os.O_RDONLY))
        except FileNotFoundError:
            continue  # it moved or went between the lookup and the open: look again
    raise FileNotFoundError(errno.ENOENT, f"{path} kept moving while it was opened", path)


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _entry_info(entry: Entry) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": entry.path,
        "size": 0 if entry.kind == "directory" else entry.size,
        "type": entry.kind if entry.kind in ("file", "directory") else "other",
        "mtime": entry.mtime_ns / 1e9,
        "node": entry.node,
        "holders": list(entry.holders),
    }
    if entry.kind == "symlink":
        info["islink"] = True
    return info


def _info(found: FileLocations) -> dict[str, Any]:
    nearest = found.holders[0]
    kind = "directory" if nearest.is_dir else ("file" if nearest.mode & 0o170000 == 0o100000 else "other")
    return {
        "name": found.path,
        "size": 0 if kind == "directory" else nearest.size,
        "type": kind,
        "mtime": nearest.mtime_ns / 1e9,
        "mode": nearest.mode,
        "node": nearest.node,
        "site": nearest.site,
        "export_path": nearest.export_path,
        "locations": [{"node": h.node, "site": h.site, "size": h.size, "rtt_ms": h.rtt_ms,
                       "export_path": h.export_path, "replica_of": h.replica_of} for h in found.holders],
    }
