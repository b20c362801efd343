"""Staging: copy a file from its holder into this node's export, as a replica.

Runs on the target node: it pulls the bytes straight from the source holder
(several 4 MiB reads in flight), writes them to a temporary file beside the
destination, gives it the source's mtime, and checks size and SHA-256 of what
landed on disk against the source's own checksum -- all before the copy has
its name. Only then is it recorded as a replica (see replicas.py, written
durably) and renamed into place, in that order, so a crash never leaves a
staged copy that looks like an original. The replica serves reads here only
while the source is unchanged.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from .._trio import open_nursery
from ..protocol import messages as msg
from ..protocol.attr import Attr
from ..protocol.messages import StageReply
from .export import Export, off_loop, temporary_name
from .locator import Location
from .namespace import Namespace
from .replicas import STAGED_XATTR, Replica, staged_mark
from .service import MAX_IO, NodeService, sync_and_hash

log = logging.getLogger(__name__)

IN_FLIGHT = 4


async def stage_file(namespace: Namespace, service: NodeService, path: str) -> StageReply:
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

    if service.replicas.damaged is not None:
        raise OSError(errno.EIO, f"node {namespace.me} cannot stage {path}: its replica table is damaged "
                                 f"({service.replicas.damaged}); see that node's log for how to repair it")
    temporary = temporary_name(path, "stage")  # carries STAGING_MARKER: the bypass never serves it
    # Durably noted first: a daemon killed mid-copy removes the temporary when it starts again.
    await off_loop(service.replicas.begin_staging, temporary, path)
    try:
        size, digest = await _copy(namespace, source.node, source.attr, temporary, path)
        source_sum = await namespace.peers.ask(source.node, msg.Checksum(path))
        after = await namespace.peers.ask(source.node, msg.Lookup(path))
        if (source_sum.size, source_sum.sha256) != (size, digest) or after is None or \
                (after.size, after.mtime_ns) != (source.attr.size, source.attr.mtime_ns):
            raise OSError(errno.EAGAIN, f"{path} changed on node {source.node} while it was copied; stage it again")
        local = await off_loop(namespace.export.lstat, temporary)
        replica = Replica(source.node, source.attr.size, source.attr.mtime_ns, local.size, local.mtime_ns, digest)
        await off_loop(_mark, namespace.export, temporary, replica)
        await off_loop(_drop_old_copy, service, path)
        # Verified; recorded as a replica (durably) *before* it gets its name, so that no crash
        # can leave a staged copy that looks like an original of this node.
        await off_loop(service.replicas.commit_staging, path, replica)
        await off_loop(_rename_durably, namespace.export, temporary, path)
    finally:
        try:
            await off_loop(namespace.export.unlink, temporary)
        except FileNotFoundError:
            pass
        await off_loop(service.replicas.end_staging, [temporary])
    namespace.locator.invalidate(path)
    copied = await off_loop(namespace.export.lstat, path)
    await namespace.locator.announce_changed(path, Location(namespace.me, copied, replica_of=source.node))
    return {"status": "copied", "source": source.node, "size": size, "sha256": digest,
            "seconds": time.monotonic() - started}


async def _copy(namespace: Namespace, source: str, attr: Attr, temporary: str, path: str) -> tuple[int, str]:
    """Pull `path` from `source` into `temporary` here; (size, sha256) of what landed on disk."""
    peers, export = namespace.peers, namespace.export
    handle = (await peers.ask(source, msg.Open(path, os.O_RDONLY))).handle
    fd = await off_loop(export.create, temporary, os.O_RDWR | os.O_EXCL, 0o600)
    try:
        offsets = iter(range(0, attr.size, MAX_IO))

        async def worker() -> None:
            for offset in offsets:  # shared iterator: each worker takes the next piece
                data = await peers.ask(source, msg.Read(handle, offset, MAX_IO), timeout=60)
                await off_loop(os.pwrite, fd, data, offset)

        async with open_nursery() as nursery:
            for _ in range(IN_FLIGHT):
                nursery.start_soon(worker)
        await off_loop(os.ftruncate, fd, attr.size)
        # Hash what actually landed on disk (this verifies our write path too), off the event loop.
        size, digest = await off_loop(sync_and_hash, fd)
        os.fchmod(fd, attr.mode & 0o7777)
        os.utime(fd, ns=(attr.atime_ns, attr.mtime_ns))
    finally:
        os.close(fd)
        try:
            await peers.ask(source, msg.Close(handle))
        except OSError:
            pass
    return size, digest


def _mark(export: Export, temporary: str, replica: Replica) -> None:
    """Mark the copy itself, so it is known as a staged copy even if the table is ever lost."""
    try:
        export.setxattr(temporary, STAGED_XATTR, staged_mark(replica))
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        log.warning("the export of this node does not support user xattrs: staged copies are not marked "
                    "(only the replica table knows them)")


def _drop_old_copy(service: NodeService, path: str) -> None:
    """A stale replica of ours at `path` goes before its successor is recorded (a crash in between
    must not leave it unrecorded); an original that appeared here meanwhile is never replaced."""
    attr = service.lookup(path)
    if attr is None:
        return
    if service.replica(path, attr) is None:
        raise FileExistsError(errno.EEXIST, f"{path} was created on this node while it was being staged")
    service.unlink(path)


def _rename_durably(export: Export, temporary: str, path: str) -> None:
    export.rename(temporary, path)
    export.sync_parent(path)
