"""The FUSE front end: translates kernel requests into namespace calls.

Kept thin on purpose: inode numbers and handles are mapped to paths and
handle objects here; what an operation *means* across nodes is decided in
`namespace.py`. Errors become FUSEError at this boundary only.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from ..errors import PeerUnavailable
from .export import Attr
from .inodes import ROOT_INODE, InodeTable
from .namespace import FileHandle, Namespace, join
from .service import IOCounters

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


def _fuse_errors(func: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """OSError -> FUSEError(errno), and never let a bug kill the mount."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await func(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except PeerUnavailable as exc:
            # The holder died or hangs: programs expect EIO, and get it within rpc_timeout.
            log.warning("%s: %s", func.__name__, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except KeyError:  # an inode or handle the kernel should no longer use
            raise pyfuse3.FUSEError(errno.ESTALE) from None
        except Exception:
            log.exception("%s failed", func.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


class GmountOperations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, namespace: Namespace, attr_ttl: float, negative_ttl: float = 0.0,
                 counters: IOCounters | None = None) -> None:
        super().__init__()
        self.ns = namespace
        self.counters = counters if counters is not None else IOCounters()
        self.ttl = attr_ttl
        self.negative_ttl = negative_ttl
        self.inodes = InodeTable()
        self._files: dict[int, FileHandle] = {}
        self._dirs: dict[int, tuple[str, list[tuple[str, Any]] | None]] = {}
        self._next_fh = 1
        # (size, mtime) of each inode at its last open: unchanged -> keep the page cache
        self._opened_version: dict[int, tuple[int, int]] = {}

    # -- helpers ---------------------------------------------------------------

    def _entry(self, inode: int, attr: Attr) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.generation = 0
        entry.entry_timeout = self.ttl
        entry.attr_timeout = self.ttl
        entry.st_mode = attr.mode
        entry.st_nlink = attr.nlink
        entry.st_uid = attr.uid
        entry.st_gid = attr.gid
        entry.st_rdev = attr.rdev
        entry.st_size = attr.size
        entry.st_blksize = attr.blksize
        entry.st_blocks = attr.blocks
        entry.st_atime_ns = attr.atime_ns
        entry.st_mtime_ns = attr.mtime_ns
        entry.st_ctime_ns = attr.ctime_ns
        return entry

    def _child(self, parent_inode: int, name: bytes) -> str:
        return join(self.inodes.path(parent_inode), os.fsdecode(name))

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    # -- lookup and attributes ---------------------------------------------------

    @_fuse_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        parent = self.inodes.path(parent_inode)
        if name == b".":
            path = parent
        elif name == b"..":
            path = parent.rsplit("/", 1)[0] or "/"
        else:
            path = join(parent, os.fsdecode(name))
        try:
            location = await self.ns.lookup(path)
        except FileNotFoundError:
            if self.negative_ttl <= 0:
                raise
            # st_ino 0: the kernel caches "no such file" for negative_ttl (PATH searches, imports, make)
            missing = pyfuse3.EntryAttributes()
            missing.st_ino = 0
            missing.entry_timeout = self.negative_ttl
            return missing
        return self._entry(self.inodes.remember(path), location.attr)

    def forget(self, inode_list: list[tuple[int, int]]) -> None:  # type: ignore[override]
        for inode, count in inode_list:
            self.inodes.forget(inode, count)
            if self.inodes.lookups(inode) == 0:
                self._opened_version.pop(inode, None)

    @_fuse_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        location = await self.ns.lookup(self.inodes.path(inode))
        return self._entry(inode, location.attr)

    @_fuse_errors
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self.inodes.path(inode)
        if fields.update_uid or fields.update_gid:
            current = (await self.ns.lookup(path)).attr
            if ((fields.update_uid and attr.st_uid != current.uid)
                    or (fields.update_gid and attr.st_gid != current.gid)):
                raise OSError(errno.EPERM, "changing owners is not supported")
        new = await self.ns.setattr(
            path,
            mode=attr.st_mode if fields.update_mode else None,
            size=attr.st_size if fields.update_size else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            handle=self._files.get(fh) if fh is not None else None,
        )
        return self._entry(inode, new)

    @_fuse_errors
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return os.fsencode(await self.ns.readlink(self.inodes.path(inode)))

    @_fuse_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        bsize, frsize, blocks, bfree, bavail, files, ffree, favail, namemax = await self.ns.statfs()
        data = pyfuse3.StatvfsData()
        data.f_bsize, data.f_frsize, data.f_blocks, data.f_bfree, data.f_bavail = bsize, frsize, blocks, bfree, bavail
        data.f_files, data.f_ffree, data.f_favail, data.f_namemax = files, ffree, favail, namemax
        return data

    # -- directories ---------------------------------------------------------------

    @_fuse_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        fh = self._new_fh()
        self._dirs[fh] = (self.inodes.path(inode), None)
        return fh

    @_fuse_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        path, entries = self._dirs[fh]
        if entries is None or start_id == 0:
            # One snapshot per listing: re-listing on every call makes big directories O(n^2).
            entries = await self.ns.listdir(path)
            self._dirs[fh] = (path, entries)
        for index in range(start_id, len(entries)):
            name, location = entries[index]
            inode = self.inodes.peek(join(path, name))
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._entry(inode, location.attr), index + 1):
                self.inodes.drop_if_unused(inode)
                break
            self.inodes.remember(join(path, name))

    @_fuse_errors
    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    @_fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        attr = await self.ns.mkdir(path, mode & ~ctx.umask)
        return self._entry(self.inodes.remember(path), attr)

    @_fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        await self.ns.rmdir(path)
        self.inodes.detach(path)

    @_fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        await self.ns.unlink(path)
        self.inodes.detach(path)

    @_fuse_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        attr = await self.ns.symlink(os.fsdecode(target), path)
        return self._entry(self.inodes.remember(path), attr)

    @_fuse_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        src = self._child(parent_inode_old, name_old)
        dst = self._child(parent_inode_new, name_new)
        is_dir = await self.ns.rename(src, dst, flags)
        self.inodes.rename(src, dst, is_dir)

    # -- files ---------------------------------------------------------------

    @_fuse_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        handle = await self.ns.open(self.inodes.path(inode), flags)
        return self._file_info(inode, handle)

    def _file_info(self, inode: int, handle: FileHandle) -> pyfuse3.FileInfo:
        fh = self._new_fh()
        self._files[fh] = handle
        version = (handle.attr.size, handle.attr.mtime_ns)
        info = pyfuse3.FileInfo(fh=fh)
        # Close-to-open: keep the kernel's cached pages only if the file is unchanged since the last open.
        info.keep_cache = self._opened_version.get(inode) == version
        self._opened_version[inode] = version
        return info

    @_fuse_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._child(parent_inode, name)
        handle = await self.ns.create(path, flags, mode & ~ctx.umask)
        inode = self.inodes.remember(path)
        return self._file_info(inode, handle), self._entry(inode, handle.attr)

    @_fuse_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._files[fh]
        data = await self.ns.read(handle, off, size)
        self.counters.mount_read(handle.fd is not None, len(data))  # fd: served from this node's export
        return data

    @_fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._files[fh]
        written = await self.ns.write(handle, off, buf)
        self.counters.mount_write(handle.fd is not None, written)
        return written

    @_fuse_errors
    async def flush(self, fh: int) -> None:
        pass  # writes go straight to the holder; nothing is buffered here

    @_fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.ns.fsync(self._files[fh], datasync)

    @_fuse_errors
    async def release(self, fh: int) -> None:
        handle = self._files.pop(fh)
        final = await self.ns.release(handle)
        inode = self.inodes.inode(handle.path)
        if handle.wrote and inode is not None:
            # Our own writes changed mtime: remember the new version so our next open keeps the cache.
            if final is None:
                self._opened_version.pop(inode, None)
            else:
                self._opened_version[inode] = (final.size, final.mtime_ns)

    # -- extended attributes ----------------------------------------------------------

    @_fuse_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        try:
            return await self.ns.getxattr(self.inodes.path(inode), os.fsdecode(name))
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None
            raise

    @_fuse_errors
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return [os.fsencode(n) for n in await self.ns.listxattr(self.inodes.path(inode))]

    @_fuse_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.ns.setxattr(self.inodes.path(inode), os.fsdecode(name), value)

    @_fuse_errors
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.ns.removexattr(self.inodes.path(inode), os.fsdecode(name))


__all__ = ["GmountOperations", "ROOT_INODE"]
