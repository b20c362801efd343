"""fsspec file system for gmount clusters: read cluster data without a local mount.

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

Listings are the merge of every node's directory, like the mount. Reading
opens the file on its nearest holder (bound at open time, close-to-open) and
fetches byte ranges from that node directly; nothing is relayed or copied
whole. ``info`` carries ``node`` (the holder read from), ``site``,
``export_path`` and ``locations``: every holder, nearest first.

Writing (``open(..., "wb")``, ``pipe``, ``put``, ``touch``) replaces a file
on the node that holds it, and creates a new one on ``node``, as a write
through that node's mount would; the whole file is sent when it is closed
(buffered locally until then), checked by size and SHA-256, and renamed into
place, so readers see the old file or the whole new one. ``mkdir`` makes the
directory on ``node``; ``rm`` removes a file from every node holding it (a
directory: from every node that has it, once empty).
"""

from __future__ import annotations

import errno
import os
import posixpath
import tempfile
from datetime import UTC
from typing import IO, Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import stringify_path

from ..errors import GmountError
from .cluster import Cluster, Entry, FileLocations

__all__ = ["GmountFile", "GmountFileSystem"]

PROTOCOL = "gmount"


def _open_cluster(cluster: Cluster | str | None) -> Cluster:
    return cluster if isinstance(cluster, Cluster) else Cluster.open(cluster or None)


class GmountFileSystem(AbstractFileSystem):
    """fsspec access to a running gmount cluster over its daemons' RPC (see module doc)."""

    protocol = PROTOCOL
    root_marker = "/"

    def __init__(self, cluster: Cluster | str | None = None, node: str | None = None, **kwargs: Any) -> None:
        super().__init__(cluster=cluster, node=node, **kwargs)
        self.cluster = _open_cluster(cluster)
        if node is not None and node not in self.cluster.nodes:
            raise GmountError(f"unknown node {node!r} in cluster {self.cluster.name!r} "
                              f"(nodes: {', '.join(self.cluster.nodes.names)})")
        self.mount = _mount_here(self.cluster)
        self.node = node if node is not None else (self.mount[0] if self.mount else self.cluster.home)

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
        return f"{PROTOCOL}://{self.cluster.name}{self._strip_protocol(name)}"

    # -- metadata ----------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        listing = self.cluster.ls(path, from_node=self.node)
        if len(listing.entries) == 1 and listing.entries[0].path == path:
            entries = [self.info(path)]  # `ls` of a file: that file, with all its details
        else:
            entries = [_entry_info(e) for e in listing.entries]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        found = self.cluster.where(path, from_node=self.node)[0]
        if not found.holders:
            raise FileNotFoundError(errno.ENOENT, f"no node of cluster {self.cluster.name!r} holds {path}", path)
        return _info(found)

    def modified(self, path: str) -> Any:
        from datetime import datetime
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=UTC)

    # -- data ------------------------------------------------------------------------

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> GmountFile | IO[bytes]:
        if mode in ("wb", "xb"):
            path = self._strip_protocol(path)
            if mode == "xb" and self.exists(path):
                raise FileExistsError(errno.EEXIST, f"{path} exists", path)
            return GmountFile(self, path, "wb", block_size, autocommit, cache_options=cache_options, **kwargs)
        if mode != "rb":
            raise NotImplementedError(f"gmount:// files open as 'rb', 'wb' or 'xb', not {mode!r} "
                                      "(to append, write through a node's mount)")
        if self.mount is not None:
            return open(self._in_mount(path), "rb")  # noqa: SIM115 -- the caller closes it, as any fsspec file
        details = self.info(path)
        if details["type"] == "directory":
            raise IsADirectoryError(errno.EISDIR, f"{details['name']} is a directory", details["name"])
        return GmountFile(self, details["name"], mode, block_size, autocommit, cache_options=cache_options,
                          details=details, **kwargs)

    def _in_mount(self, path: str) -> str:
        assert self.mount is not None
        return os.path.join(self.mount[1], self._strip_protocol(path).lstrip("/"))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """One round of reads from the nearest holder, without the file object's block cache."""
        if self.mount is not None:
            with open(self._in_mount(path), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                first = 0 if start is None else (max(0, size + start) if start < 0 else start)
                stop = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
                f.seek(first)
                return f.read(max(0, stop - first))
        details = self.info(path)
        if details["type"] == "directory":
            raise IsADirectoryError(errno.EISDIR, f"{details['name']} is a directory", details["name"])
        size = details["size"]
        first = 0 if start is None else (max(0, size + start) if start < 0 else start)
        stop = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
        if stop <= first:
            return b""
        return self.cluster.read_range(details["name"], first, stop, holder=details["node"])

    # -- writing ---------------------------------------------------------------------

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if mode == "create" and self.exists(path):
            raise FileExistsError(errno.EEXIST, f"{path} exists", path)
        self.cluster.write_bytes(path, value, from_node=self.node)

    def put_file(self, lpath: str, rpath: str, callback: Any = None, mode: str = "overwrite", **kwargs: Any) -> None:
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        if mode == "create" and self.exists(rpath):
            raise FileExistsError(errno.EEXIST, f"{rpath} exists", rpath)
        self.cluster.put(lpath, rpath, from_node=self.node)
        if callback is not None:
            size = os.path.getsize(lpath)
            callback.set_size(size)
            callback.relative_update(size)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        self.pipe_file(path2, self.cat_file(path1))

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if not create_parents and not self.isdir(posixpath.dirname(path)):
            raise FileNotFoundError(errno.ENOENT, f"{posixpath.dirname(path)} is not a directory", path)
        self.cluster.mkdir(path, from_node=self.node)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        if self.exists(path):
            if exist_ok and self.isdir(path):
                return
            raise FileExistsError(errno.EEXIST, f"{path} exists", path)
        self.cluster.mkdir(path, from_node=self.node)

    def rm_file(self, path: str) -> None:
        self.cluster.remove(self._strip_protocol(path), from_node=self.node)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def rmdir(self, path: str) -> None:
        path = self._strip_protocol(path)
        if not self.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, f"{path} is not a directory", path)
        self.cluster.remove(path, from_node=self.node)


class GmountFile(AbstractBufferedFile):
    """A file opened for reading, bound to the holder found at open time (close-to-open) -- or for
    writing: buffered in a local temporary file and sent whole on close (see the module doc)."""

    def __init__(self, fs: GmountFileSystem, path: str, mode: str, block_size: Any, autocommit: bool,
                 cache_options: Any = None, details: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.holder: str | None = details["node"] if details is not None else None
        self._spool: Any = None
        sized = {"size": details["size"]} if details is not None else {}
        super().__init__(fs, path, mode, block_size if block_size is not None else "default", autocommit,
                         cache_options=cache_options, **sized, **kwargs)
        if details is not None:
            self.details = details

    def _initiate_upload(self) -> None:
        # open across _upload_chunk calls, closed by the final one: no `with` can span them
        self._spool = tempfile.SpooledTemporaryFile(max_size=64 * 1024 * 1024)  # noqa: SIM115

    def _upload_chunk(self, final: bool = False) -> bool:
        self._spool.write(self.buffer.getvalue())
        if final:
            fs: GmountFileSystem = self.fs
            self._spool.seek(0)
            try:
                fs.cluster.write_from(self.path, self._spool, from_node=fs.node)
            finally:
                self._spool.close()
        return True

    def _fetch_range(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        fs: GmountFileSystem = self.fs
        assert self.holder is not None, "only files opened for reading fetch ranges"
        return fs.cluster.read_range(self.path, start, end, holder=self.holder)


def _mount_here(cluster: Cluster) -> tuple[str, str] | None:
    """(node, mountpoint) when this process runs on a node of `cluster` whose mount is on this machine."""
    node = os.environ.get("GMOUNT_NODE")
    if os.environ.get("GMOUNT_CLUSTER") != cluster.name or node not in cluster.spec.nodes:
        return None
    mountpoint = cluster.spec.nodes[node].mountpoint
    return (node, mountpoint) if os.path.ismount(mountpoint) else None


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
