"""Staging: copy a file from its holder into this node's export, as a replica.

Runs on the target node: it pulls the bytes straight from the source holder
(several 4 MiB reads in flight), writes them to a temporary file beside the
destination, checks size and SHA-256 against the source's own checksum,
gives the copy the source's mtime, and renames it into place. The copy is
recorded as a replica (see replicas.py) so it serves reads here only while
the source is unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
import uuid
from typing import Any

import trio

from .export import Attr
from .namespace import Namespace
from .replicas import Replica
from .service import MAX_IO, NodeService
from .._trio import open_nursery

IN_FLIGHT = 4


async def stage_file(namespace: Namespace, service: NodeService, path: str) -> dict[str, Any]:
    started = time.monotonic()
    holders = await namespace.where(path)
    originals = [loc for loc in holders if loc.replica_of is None]
    if not originals:
        raise FileNotFoundError(errno.ENOENT, f"no node holds {path}")
    if any(loc.node == namespace.me for loc in originals):
        attr = next(loc.attr for loc in originals if loc.node == namespace.me)
        return {"status": "local", "source": namespace.me, "size": attr.size, "sha256": None,
                "seconds": time.monotonic() - started}
    source = originals[0]
    if not source.attr.is_file:
        raise OSError(errno.EISDIR if source.attr.is_dir else errno.EINVAL,
                      f"{path} on node {source.node} is not a regular file")
    current = next((loc for loc in holders if loc.node == namespace.me), None)
    replica = service.replicas.get(path)
    if current is not None and replica is not None and replica.source == source.node \
            and replica.matches_source(source.attr):
        return {"status": "up-to-date", "source": source.node, "size": replica.local_size,
                "sha256": replica.sha256, "seconds": time.monotonic() - started}

    size, digest = await _copy(namespace, source.node, source.attr, path)
    source_size, source_digest = await namespace.peers.call(source.node, "checksum", path)
    after = Attr.from_wire(await namespace.peers.call(source.node, "lookup", path))
    if (source_size, source_digest) != (size, digest) or \
            (after.size, after.mtime_ns) != (source.attr.size, source.attr.mtime_ns):
        namespace.export.unlink(path)
        raise OSError(errno.EAGAIN, f"{path} changed on node {source.node} while it was copied; stage it again")
    local = namespace.export.lstat(path)
    service.replicas.add(path, Replica(source.node, source.attr.size, source.attr.mtime_ns,
                                       local.size, local.mtime_ns, digest))
    namespace.locator.invalidate(path)
    return {"status": "copied", "source": source.node, "size": size, "sha256": digest,
            "seconds": time.monotonic() - started}


async def _copy(namespace: Namespace, source: str, attr: Attr, path: str) -> tuple[int, str]:
    """Pull `path` from `source` into a temporary file here, then rename it into place."""
    peers, export = namespace.peers, namespace.export
    directory, name = path.rsplit("/", 1)
    temporary = f"{directory}/.{name}.gmount-stage-{uuid.uuid4().hex[:8]}"
    handle, _ = await peers.call(source, "open", path, os.O_RDONLY)
    fd = export.create(temporary, os.O_RDWR | os.O_EXCL, 0o600)
    try:
        offsets = iter(range(0, attr.size, MAX_IO))

        async def worker() -> None:
            for offset in offsets:  # shared iterator: each worker takes the next piece
                data = await peers.call(source, "read", handle, offset, MAX_IO, timeout=60)
                os.pwrite(fd, data, offset)

        async with open_nursery() as nursery:
            for _ in range(IN_FLIGHT):
                nursery.start_soon(worker)
        os.ftruncate(fd, attr.size)
        # Hash what actually landed on disk (this verifies our write path too), off the event loop.
        size, digest = await trio.to_thread.run_sync(_hash_and_sync, fd)
        os.fchmod(fd, attr.mode & 0o7777)
        os.utime(fd, ns=(attr.atime_ns, attr.mtime_ns))
    except BaseException:
        os.close(fd)
        try:
            export.unlink(temporary)
        except OSError:
            pass
        raise
    finally:
        try:
            await peers.call(source, "close", handle)
        except OSError:
            pass
    os.close(fd)
    export.rename(temporary, path)
    return size, digest


def _hash_and_sync(fd: int) -> tuple[int, str]:
    os.fsync(fd)
    digest = hashlib.sha256()
    size = 0
    while block := os.pread(fd, 1 << 20, size):
        digest.update(block)
        size += len(block)
    return size, digest.hexdigest()
