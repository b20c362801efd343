"""Reading and writing files of the namespace from outside any mount: lookups, listings, reads,
whole-file writes and copies, mkdir, remove, checksums, byte counters."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import posixpath
from collections.abc import Iterable
from typing import IO, TypeVar

import trio

from .._trio import open_nursery
from ..errors import GmountError
from ..node.export import temporary_name
from ..protocol import messages as msg
from ..protocol.client import ClusterClient
from .paths import PathLike, Paths, as_list
from .requests import LOOKUPS_IN_FLIGHT, READ_PIECE, Requests, close_quietly, readable_holder, write_handle
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

    def answering(self, nodes: Iterable[str | Node] | None, timeout: float) -> tuple[str, ...]:
        names = list(self._view.state.spec.nodes) if nodes is None else [self._view.node_name(n) for n in nodes]

        async def main(client: ClusterClient) -> tuple[str, ...]:
            alive: set[str] = set()

            async def one(node: str) -> None:
                try:
                    with trio.fail_after(timeout):
                        await client.ask(node, msg.Ping(), timeout=timeout)
                except (OSError, GmountError, trio.TooSlowError):
                    return
                alive.add(node)

            async with open_nursery() as nursery:
                for node in names:
                    nursery.start_soon(one, node)
            return tuple(node for node in names if node in alive)

        return self._requests.run(main)

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
            target = chosen or await near_directory(self._requests, client, asking, ns_path)
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
        temporary = temporary_name(target, "get")  # beside it, fitting NAME_MAX whatever its name

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
                await close_quietly(client, holder.node, msg.Close(opened.handle))
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
            plan = await plan_put(self._requests, client, asking, ns_path, chosen)
            handle = await put_open(client, plan, mode)
            try:
                digest = hashlib.sha256()
                size = await write_handle(client, plan.target, handle, 0,
                                          iter(lambda: source.read(READ_PIECE), b""), digest)
                await finish_put(client, plan, handle, size, digest.hexdigest())
            except BaseException:
                await close_quietly(client, plan.target, msg.PutAbort(handle))  # the temporary file goes
                raise
            return plan.target

        return self._requests.run(main)


# -- whole-file writes from outside the mount: shared with the fsspec backend ------------------


@dataclasses.dataclass(frozen=True)
class PutPlan:
    """Where a whole-file write lands, and what was there before it."""

    path: str
    target: str              # the node whose export takes the file
    found: FileLocations     # the holders of the name before the write
    new_parent: bool         # the parent directory exists nowhere yet: the put makes it on `target`


async def plan_put(requests: Requests, client: ClusterClient, asking: str, ns_path: str,
                   chosen: str | None) -> PutPlan:
    """Node `chosen` if given; else the node holding the original now (it is replaced there, as a
    write through the mount would); else the node near its directory's data (`near_directory`)."""
    found = await requests.where(client, asking, ns_path)
    if found.nearest is not None and found.nearest.is_dir:
        raise IsADirectoryError(errno.EISDIR, f"{ns_path} is a directory (on node {found.nearest.node})")
    originals = [h.node for h in found.holders if h.replica_of is None]
    new_parent = False
    if not originals:
        parent = (await requests.where(client, asking, posixpath.dirname(ns_path))).nearest
        if parent is not None and not parent.is_dir:
            raise NotADirectoryError(errno.ENOTDIR, f"{posixpath.dirname(ns_path)} is a file (on node {parent.node})")
        new_parent = parent is None
    target = chosen or (originals[0] if originals else await near_directory(requests, client, asking, ns_path))
    return PutPlan(ns_path, target, found, new_parent)


async def near_directory(requests: Requests, client: ClusterClient, asking: str, ns_path: str) -> str:
    """The node for a new name written from outside the mounts: near the data of its directory.

    The node whose export holds the name's directory -- of several, the one holding the most
    bytes of files directly in it, then the nearest to `asking`; a directory no node has yet:
    the same for its parent, and so on up. Below the namespace root nothing is held (or only
    the root is): `asking`, as a create through its mount would.
    """
    directory = posixpath.dirname(ns_path)
    while directory != "/":
        found = await requests.where(client, asking, directory)
        holders = [h.node for h in found.holders if h.is_dir and h.replica_of is None]  # nearest first
        if len(holders) == 1:
            return holders[0]
        if holders:
            held = dict.fromkeys(holders, 0)
            for entry in (await requests.listing(client, asking, directory)).entries:
                if entry.kind == "file":
                    for node in entry.holders:
                        if node in held:
                            held[node] += entry.size
            most = max(held.values())
            return next(node for node in holders if held[node] == most)
        directory = posixpath.dirname(directory)
    return asking


async def put_open(client: ClusterClient, plan: PutPlan, mode: int) -> int:
    """Start a verified whole-file write on the plan's target: a handle for `write`, then finish or PutAbort."""
    try:
        return await client.ask(plan.target, msg.PutOpen(plan.path, mode & 0o7777))
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            raise GmountError(f"node {plan.target} cannot take writes from outside its mount: its daemon "
                              "has no 'put' operation (restart the cluster with this gmountpy)") from None
        raise


async def finish_put(client: ClusterClient, plan: PutPlan, handle: int, size: int, sha256: str) -> None:
    """Check what landed against (size, sha256) and rename it into place; then the new file is the only one."""
    await client.ask(plan.target, msg.PutClose(handle, size, sha256), timeout=60.0 + size / 20e6)
    if plan.new_parent:
        await client.ask(plan.target, msg.Rescan())  # the parents the put made: their homes hear of them now
    for holder in plan.found.holders:
        if holder.node != plan.target and not holder.is_dir:
            try:
                await client.ask(holder.node, msg.Unlink(plan.path))
            except FileNotFoundError:
                pass
