"""Reading and writing files of the namespace from outside any mount: lookups, listings, reads,
whole-file writes and copies, mkdir, remove, checksums, byte counters."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import posixpath
import threading
from collections.abc import Iterable
from typing import IO, TypeVar

import trio

from .._trio import open_nursery
from ..errors import GmountError
from ..protocol import messages as msg
from ..protocol.client import ClusterClient
from .paths import PathLike, Paths, as_list
from .requests import LOOKUPS_IN_FLIGHT, READ_PIECE, READS_IN_FLIGHT, Requests, readable_holder
from .results import FileLocations, Listing, Locations, Node
from .view import ClusterView

_T = TypeVar("_T")


class Files:
    """The file operations of `api.Cluster` (documented there)."""

    def __init__(self, view: ClusterView, paths: Paths, requests: Requests) -> None:
        self._view = view
        self._paths = paths
        self._requests = requests

    def counters(self) -> dict[str, dict[str, int]]:
        return self._ask_each(list(self._view.state.spec.nodes), msg.Counters())

    def rescan(self, nodes: Iterable[str | Node] | None = None) -> dict[str, int]:
        names = list(self._view.state.spec.nodes) if nodes is None else [str(node) for node in nodes]
        unknown = [name for name in names if name not in self._view.state.spec.nodes]
        if unknown:
            raise GmountError(f"no node {unknown[0]!r} in cluster {self._view.state.name!r} "
                              f"(nodes: {', '.join(self._view.state.spec.nodes)})")
        return self._ask_each(names, msg.Rescan())

    def _ask_each(self, names: list[str], request: msg.Request[_T]) -> dict[str, _T]:
        """The same request to each node, all at once; the answers in the order of `names`."""

        async def main(client: ClusterClient) -> dict[str, _T]:
            result: dict[str, _T] = {}

            async def one(node: str) -> None:
                result[node] = await client.ask(node, request)

            async with open_nursery() as nursery:
                for node in names:
                    nursery.start_soon(one, node)
            return {node: result[node] for node in names}

        return self._requests.run(main)

    def where(self, paths: PathLike | Iterable[PathLike], from_node: str | Node | None = None) -> Locations:
        given = as_list(paths)
        asks = [self._paths.resolve(p, from_node) for p in given]

        async def main(client: ClusterClient) -> Locations:
            results: list[FileLocations | None] = [None] * len(asks)
            limiter = trio.CapacityLimiter(LOOKUPS_IN_FLIGHT)

            async def one(i: int, path: str, node: str) -> None:
                async with limiter:
                    found = await self._requests.where(client, node, path)
                results[i] = dataclasses.replace(found, given=os.fspath(given[i]))

            async with open_nursery() as nursery:
                for i, (path, node) in enumerate(asks):
                    nursery.start_soon(one, i, path, node)
            return Locations(tuple(r for r in results if r is not None))

        return self._requests.run(main)

    def ls(self, path: PathLike = "/", from_node: str | Node | None = None) -> Listing:
        ns_path, asking = self._paths.resolve(path, from_node)
        return self._requests.run(self._requests.listing, asking, ns_path)

    def read_bytes(self, path: PathLike, *, start: int = 0, end: int | None = None,
                   from_node: str | Node | None = None) -> bytes:
        ns_path, asking = self._paths.resolve(path, from_node)

        async def main(client: ClusterClient) -> bytes:
            found = await self._requests.where(client, asking, ns_path)
            holder = readable_holder(found)
            return await self._requests.read(client, holder.node, ns_path, start, end)

        return self._requests.run(main)

    def read_range(self, path: PathLike, start: int, end: int | None, *, holder: str | Node) -> bytes:
        ns_path, node = self._paths.resolve(path, holder)

        async def main(client: ClusterClient) -> bytes:
            return await self._requests.read(client, node, ns_path, start, end)

        try:
            return self._requests.run(main)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"{ns_path} is gone from node {node}", ns_path) from None

    def put(self, local: PathLike, path: PathLike, *, on: str | Node | None = None, mode: int | None = None,
            from_node: str | Node | None = None) -> str:
        with open(local, "rb") as source:
            if mode is None:
                mode = os.fstat(source.fileno()).st_mode & 0o7777
            return self.write_from(path, source, on, mode, from_node)

    def mkdir(self, path: PathLike, *, on: str | Node | None = None, from_node: str | Node | None = None) -> str:
        ns_path, asking = self._paths.resolve(path, from_node)
        chosen = self._view.node_name(on) if on is not None else None

        async def main(client: ClusterClient) -> str:
            found = await self._requests.where(client, asking, ns_path)
            if found.nearest is not None:
                raise FileExistsError(errno.EEXIST, f"{ns_path} exists (on node {found.nearest.node})")
            target = chosen or await self.near_directory(client, asking, ns_path)
            await client.ask(target, msg.Mkdir(ns_path, 0o755))  # (with its parents) in `target`'s export
            await client.ask(target, msg.Rescan())  # its homes hear of it now, not at the next scan
            return target

        return self._requests.run(main)

    def remove(self, path: PathLike, from_node: str | Node | None = None) -> tuple[str, ...]:
        ns_path, asking = self._paths.resolve(path, from_node)

        async def main(client: ClusterClient) -> tuple[str, ...]:
            # as `asking`'s mount removes it: every holder, and the directory's home, before the reply
            return tuple(await client.ask(asking, msg.Remove(ns_path)))

        return self._requests.run(main)

    async def near_directory(self, client: ClusterClient, asking: str, ns_path: str) -> str:
        """The node for a new name written from outside the mounts: near the data of its directory.

        The node whose export holds the name's directory -- of several, the one holding the most
        bytes of files directly in it, then the nearest to `asking`; a directory no node has yet:
        the same for its parent, and so on up. Below the namespace root nothing is held (or only
        the root is): `asking`, as a create through its mount would.
        """
        directory = posixpath.dirname(ns_path)
        while directory != "/":
            found = await self._requests.where(client, asking, directory)
            holders = [h.node for h in found.holders if h.is_dir and h.replica_of is None]  # nearest first
            if len(holders) == 1:
                return holders[0]
            if holders:
                held = dict.fromkeys(holders, 0)
                for entry in (await self._requests.listing(client, asking, directory)).entries:
                    if entry.kind == "file":
                        for node in entry.holders:
                            if node in held:
                                held[node] += entry.size
                most = max(held.values())
                return next(node for node in holders if held[node] == most)
            directory = posixpath.dirname(directory)
        return asking

    def checksum(self, path: PathLike, from_node: str | Node | None = None) -> tuple[int, str]:
        ns_path, asking = self._paths.resolve(path, from_node)

        async def main(client: ClusterClient) -> tuple[int, str]:
            holder = readable_holder(await self._requests.where(client, asking, ns_path))
            reply = await client.ask(holder.node, msg.Checksum(ns_path), timeout=60.0 + holder.size / 50e6)
            return reply.size, reply.sha256

        return self._requests.run(main)

    def get(self, path: PathLike, local: PathLike, from_node: str | Node | None = None) -> tuple[int, str]:
        ns_path, asking = self._paths.resolve(path, from_node)
        target = os.fspath(local)
        temporary = f"{target}.gmount-get-{os.getpid()}-{threading.get_ident()}"

        async def main(client: ClusterClient) -> tuple[int, str]:
            holder = readable_holder(await self._requests.where(client, asking, ns_path))
            opened = await client.ask(holder.node, msg.Open(ns_path, os.O_RDONLY))
            digest = hashlib.sha256()
            size = 0
            try:
                with open(temporary, "wb") as out:
                    while piece := await client.ask(holder.node, msg.Read(opened.handle, size, READ_PIECE),
                                                   timeout=60.0):
                        out.write(piece)
                        digest.update(piece)
                        size += len(piece)
            finally:
                with trio.CancelScope(shield=True):
                    try:
                        await client.ask(holder.node, msg.Close(opened.handle))
                    except OSError:
                        pass
            source = await client.ask(holder.node, msg.Checksum(ns_path), timeout=60.0 + size / 50e6)
            if (source.size, source.sha256) != (size, digest.hexdigest()):
                raise OSError(errno.EAGAIN, f"{ns_path} changed on node {holder.node} while it was copied "
                                            f"({size} bytes read, {source.size} there now); copy it again")
            os.utime(temporary, ns=(opened.attr.atime_ns, opened.attr.mtime_ns))
            return size, digest.hexdigest()

        try:
            result = self._requests.run(main)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        os.replace(temporary, target)
        return result

    def write_from(self, path: PathLike, source: IO[bytes], on: str | Node | None, mode: int,
                  from_node: str | Node | None) -> str:
        ns_path, asking = self._paths.resolve(path, from_node)
        if ns_path == "/":
            raise IsADirectoryError(errno.EISDIR, "/ is the namespace root, not a file")
        chosen = self._view.node_name(on) if on is not None else None

        async def main(client: ClusterClient) -> str:
            found = await self._requests.where(client, asking, ns_path)
            if found.nearest is not None and found.nearest.is_dir:
                raise IsADirectoryError(errno.EISDIR, f"{ns_path} is a directory (on node {found.nearest.node})")
            originals = [h.node for h in found.holders if h.replica_of is None]
            target = chosen or (originals[0] if originals else await self.near_directory(client, asking, ns_path))
            try:
                handle = await client.ask(target, msg.PutOpen(ns_path, mode & 0o7777))
            except OSError as exc:
                if exc.errno == errno.ENOSYS:
                    raise GmountError(f"node {target} cannot take writes from outside its mount: its daemon "
                                      "has no 'put' operation (restart the cluster with this gmountpy)") from None
                raise
            digest = hashlib.sha256()
            size = 0
            try:
                in_flight = trio.Semaphore(READS_IN_FLIGHT)

                async def send(offset: int, piece: bytes) -> None:
                    try:
                        await client.ask(target, msg.Write(handle, offset, piece), timeout=60.0)
                    finally:
                        in_flight.release()

                async with open_nursery() as nursery:
                    while piece := source.read(READ_PIECE):
                        digest.update(piece)
                        await in_flight.acquire()
                        nursery.start_soon(send, size, piece)
                        size += len(piece)
                await client.ask(target, msg.PutClose(handle, size, digest.hexdigest()), timeout=60.0 + size / 20e6)
            except BaseException:
                with trio.CancelScope(shield=True):
                    try:
                        await client.ask(target, msg.PutAbort(handle))
                    except OSError:
                        pass  # the handle's temporary file goes with the connection anyway
                raise
            for holder in found.holders:  # the new file is the only one of that name
                if holder.node != target and not holder.is_dir:
                    try:
                        await client.ask(holder.node, msg.Unlink(ns_path))
                    except FileNotFoundError:
                        pass
            return target

        return self._requests.run(main)
