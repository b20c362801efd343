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
import posixpath
import stat
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import pyfuse3
import trio

from ..errors import PeerUnavailable
from ..protocol.attr import Attr
from .inodes import ROOT_INODE, InodeTable
from .locator import AbsentForNow
from .namespace import FileHandle, Namespace, join
from .passthrough import Passthrough
from .service import IOCounters

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: How long a peer's "created" notice waits for the kernel to drop its negative entries
#: before answering. invalidate_entry blocks while an operation in that directory is in
#: progress here (e.g. our own create, itself waiting for that peer): never wait forever.
KERNEL_NOTIFY_WAIT = 0.5
#: "not found" answers the kernel may still cache that this node tracks (to invalidate them on a create)
MAX_NEGATIVES = 100_000
#: Capabilities (linux/capability.h): bypass file permission checks; keep set-gid when writing.
CAP_DAC_OVERRIDE = 1
CAP_FSETID = 4


def _version(attr: Attr) -> tuple[int, int, int]:
    """What tells one content of a file from another, as far as the kernel's caches go."""
    return attr.size, attr.mtime_ns, attr.ctime_ns


def _caller(ctx: pyfuse3.RequestContext) -> tuple[list[int], int] | None:
    """The supplementary groups and effective capabilities of the process behind a request (None:
    it is gone), for the checks the kernel leaves to this daemon."""
    try:
        with open(f"/proc/{ctx.pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        return [int(g) for g in status.get("Groups", "").split()], int(status.get("CapEff", "0").strip(), 16)
    except (OSError, ValueError):
        return None


def _drops_setgid(attr: Attr, ctx: pyfuse3.RequestContext) -> bool:
    """Whether a write or truncate by the caller clears the file's set-gid bit where the kernel's FUSE
    code does not: set-gid without group-exec, and a caller outside the file's group and without
    CAP_FSETID (ext4's rule; root is taken to have it). The kernel clears set-uid, and set-gid with
    group-exec, itself."""
    if (not attr.is_file or attr.mode & (stat.S_ISGID | stat.S_IXGRP) != stat.S_ISGID
            or ctx.uid == 0 or ctx.gid == attr.gid):
        return False
    caller = _caller(ctx)
    if caller is None:
        return False  # the caller is gone: nothing to tell, keep the bit as the kernel's FUSE code does
    groups, capabilities = caller
    return attr.gid not in groups and not capabilities & (1 << CAP_FSETID)


def _check_open(attr: Attr, flags: int, ctx: pyfuse3.RequestContext) -> None:
    """EACCES unless the caller may open the existing file `attr` with `flags` by its mode bits, as the
    kernel checks an open (it did not check this one: it asked to create a name it had cached as
    missing, which another node had made meanwhile -- the daemon, maybe root, opens it)."""
    want = (0 if flags & os.O_ACCMODE == os.O_WRONLY else 4) | (
        2 if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC else 0)
    if ctx.uid == 0:
        return
    caller = _caller(ctx)
    groups, capabilities = caller if caller is not None else ([], 0)
    if capabilities & (1 << CAP_DAC_OVERRIDE):
        return
    if ctx.uid == attr.uid:
        allowed = attr.mode >> 6
    elif ctx.gid == attr.gid or attr.gid in groups:
        allowed = attr.mode >> 3
    else:
        allowed = attr.mode
    if want & ~allowed & 0o7:
        raise PermissionError(errno.EACCES, "permission denied: the file was made on another node meanwhile")


def _dot_entry(inode: int) -> pyfuse3.EntryAttributes:
    """What a listing says of "." or "..": a directory and its inode (the kernel ignores the rest)."""
    entry = pyfuse3.EntryAttributes()
    entry.st_ino = inode
    entry.st_mode = stat.S_IFDIR | 0o755
    return entry


def _invalidate_entry(parent_inode: int, name: str) -> None:
    """Run in a worker thread: the kernel call blocks while that directory is busy."""
    try:
        pyfuse3.invalidate_entry(parent_inode, os.fsencode(name))
    except FileNotFoundError:
        pass  # the kernel had no entry for it
    except OSError as exc:
        log.info("could not invalidate the kernel's entry %s in inode %d: %s", name, parent_inode, exc)


def _invalidate_inode(inode: int, attr_only: bool) -> None:
    try:
        pyfuse3.invalidate_inode(inode, attr_only)
    except FileNotFoundError:
        pass  # the kernel forgot the inode meanwhile
    except OSError as exc:
        log.info("could not invalidate the kernel's caches of inode %d: %s", inode, exc)


def _fuse_errors(func: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
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
        self.inodes = InodeTable(namespace.site_of)  # numbers from each file's holder: see inodes.py
        self._files: dict[int, FileHandle] = {}
        # Open files are keyed by inode: fh -> inode, inode -> its open fhs.
        self._inode_of: dict[int, int] = {}
        self._open: dict[int, set[int]] = {}
        self._dirs: dict[int, tuple[str, list[tuple[str, Any]] | None]] = {}
        self._drop_setgid_at_write: set[int] = set()  # fhs whose first write clears set-gid (`_drops_setgid`)
        self._next_fh = 1
        # version of each inode at its last open: unchanged -> keep the page cache
        self._opened_version: dict[int, tuple[int, int, int]] = {}
        # version of each inode the kernel was last given attributes for
        self._told: dict[int, tuple[int, int, int]] = {}
        # counts "created elsewhere" notices: a lookup that saw one while it ran does
        # not let the kernel cache its "not found"
        self._created_notices = 0
        #: (parent inode, name) -> when the kernel's cached "not found" for it expires: only these
        #: need invalidating when a peer creates the name (a kernel call contends for the directory's
        #: lock, so calling it for every create anywhere would serialise creates cluster-wide)
        self._negatives: dict[tuple[int, str], float] = {}
        # threads for invalidating entries: the kernel call blocks while that directory is busy
        self._entry_limiter = trio.CapacityLimiter(4)
        namespace.on_created_elsewhere = self.created_elsewhere
        #: kernel passthrough of this node's files (passthrough.py), when the daemon may use it
        self.passthrough: Passthrough | None = None
        #: the mount root's `user.gmount.bypass`: where jobs' preload library asks (bypass.py)
        self.bypass_xattr: bytes | None = None

    # -- helpers ---------------------------------------------------------------

    def _entry(self, inode: int, attr: Attr) -> pyfuse3.EntryAttributes:
        self._told[inode] = _version(attr)
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
        notices = self._created_notices
        try:
            location = await self.ns.lookup(path)
        except AbsentForNow:
            raise  # some node could not be asked: the kernel must not keep this answer
        except FileNotFoundError:
            if path != "/":
                self.inodes.detach(path)  # gone: an inode kept for the name is no live entry of it any more
            if (self.negative_ttl <= 0 or notices != self._created_notices
                    or not self._remember_negative(parent_inode, os.fsdecode(name))):
                raise  # a plain ENOENT is not cached by the kernel
            # st_ino 0: the kernel caches "no such file" for negative_ttl (PATH searches, imports, make)
            missing = pyfuse3.EntryAttributes()
            missing.st_ino = 0
            missing.entry_timeout = self.negative_ttl
            return missing
        return self._entry(self.inodes.remember(path, location.node, location.attr), location.attr)

    def forget(self, inode_list: list[tuple[int, int]]) -> None:  # type: ignore[override]
        for inode, count in inode_list:
            self.inodes.forget(inode, count)
            if self.inodes.lookups(inode) == 0:
                self._opened_version.pop(inode, None)
                self._told.pop(inode, None)

    async def created_elsewhere(self, path: str, is_dir: bool) -> None:
        """A peer created `path`: drop the kernel's negative entries for it and its parents.

        Only names the kernel may hold as "not found" are invalidated: those whose
        parent it knows and which have no inode here. Waits at most KERNEL_NOTIFY_WAIT.
        """
        self._created_notices += 1
        now = time.monotonic()
        pairs = []
        while path != "/":
            parent, name = path.rsplit("/", 1)
            parent = parent or "/"
            parent_inode = self.inodes.inode(parent)
            negative = self._negatives.pop((parent_inode, name), 0.0) if parent_inode is not None else 0.0
            # a name with an inode here is a live entry (made here since, or found): invalidating it
            # would unhash it -- a process working in that directory would lose its cwd (ENOENT)
            if parent_inode is not None and negative > now and self.inodes.inode(path) is None:
                pairs.append((parent_inode, name))
            path = parent
        if not pairs:
            return
        with trio.move_on_after(KERNEL_NOTIFY_WAIT):
            for parent_inode, name in reversed(pairs):
                await trio.to_thread.run_sync(_invalidate_entry, parent_inode, name, abandon_on_cancel=True,
                                              limiter=self._entry_limiter)

    async def changed_outside(self, path: str) -> None:
        """This node's file `path` was written without this mount (a job's bypass): drop the kernel's
        attributes of it, so a stat through this mount shows the new size at once; the next open
        finds the version changed and drops its pages."""
        inode = self.inodes.inode(path)
        if inode is None:
            return
        self._told.pop(inode, None)
        with trio.move_on_after(KERNEL_NOTIFY_WAIT):
            await trio.to_thread.run_sync(_invalidate_inode, inode, True, abandon_on_cancel=True,
                                          limiter=self._entry_limiter)

    def _remember_negative(self, parent_inode: int, name: str) -> bool:
        """Note a "not found" the kernel will cache; False when too many are tracked (then say it uncached)."""
        now = time.monotonic()
        if len(self._negatives) >= MAX_NEGATIVES:  # bounded: drop what the kernel has expired already
            self._negatives = {key: until for key, until in self._negatives.items() if until > now}
            if len(self._negatives) >= MAX_NEGATIVES:
                return False
        # a little margin: the kernel's clock for the entry started when it got the reply
        self._negatives[(parent_inode, name)] = now + self.negative_ttl + 1.0
        return True

    @_fuse_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        handles = self._open.get(inode)
        if handles:
            # An open file answers for itself, even if unlinked or renamed meanwhile.
            return self._entry(inode, await self.ns.fstat(self._files[next(iter(handles))]))
        return self._entry(inode, await self._attributes_of(inode))

    async def _attributes_of(self, inode: int) -> Attr:
        """The file's attributes through one of its names (a hard link's other names when one went).

        A name that is now another file's (replaced on another node, or by a copy staged here) is
        no longer this inode's: ESTALE then has the kernel look the name up again (the VFS retries
        a path walk once on ESTALE), and the caller sees the file the name has now."""
        names = self.inodes.names(inode)[::-1] or [self.inodes.path(inode)]
        for index, path in enumerate(names):
            try:
                location = await self.ns.lookup(path)
            except FileNotFoundError:
                if index == len(names) - 1:
                    raise
                self.inodes.detach(path, inode)
                continue
            if self.inodes.is_file_of(inode, location.node, location.attr):
                return location.attr
            self.inodes.detach(path, inode)
        raise OSError(errno.ESTALE, f"inode {inode} is no longer the file its names show")

    @_fuse_errors
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self.inodes.path(inode)
        mode = attr.st_mode if fields.update_mode else None
        if fields.update_size and ctx.uid != 0:  # a truncate, with the kernel's clearing of set-uid or not
            current = (await self.ns.lookup(path)).attr
            if mode is not None:
                current = current._replace(mode=stat.S_IFMT(current.mode) | stat.S_IMODE(mode))
            if _drops_setgid(current, ctx):
                mode = current.mode & ~stat.S_ISGID
        if fields.update_uid or fields.update_gid:
            owned = await self.ns.chown(path, attr.st_uid if fields.update_uid else -1,
                                        attr.st_gid if fields.update_gid else -1)
            if not (fields.update_mode or fields.update_size or fields.update_atime or fields.update_mtime):
                return self._entry(inode, owned)
        new = await self.ns.setattr(
            path,
            mode=mode,
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
        # "." and ".." first, as local file systems list them (`ls -a`); the kernel looks neither up
        # from a listing, so they carry only their inode and type, and count no lookup.
        for index, name in ((0, "."), (1, "..")):
            if index >= start_id:
                inode = self.inodes.inode(path if name == "." else posixpath.dirname(path)) or ROOT_INODE
                if not pyfuse3.readdir_reply(token, os.fsencode(name), _dot_entry(inode), index + 1):
                    return
        for index in range(max(start_id - 2, 0), len(entries)):
            name, location = entries[index]
            inode = self.inodes.peek(join(path, name), location.node, location.attr)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._entry(inode, location.attr), index + 3):
                self._told.pop(inode, None)  # the kernel did not take these attributes
                self.inodes.drop_if_unused(inode)
                break
            self.inodes.count_lookup(inode)

    @_fuse_errors
    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    @_fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        attr = await self._give_to_caller(path, await self.ns.mkdir(path, mode & ~ctx.umask), ctx)
        return self._entry(self.inodes.remember(path, self.ns.me, attr), attr)

    @_fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        await self.ns.rmdir(path)
        self.inodes.detach(path)

    @_fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        inode = self.inodes.inode(path)
        await self.ns.unlink(path)
        self.inodes.detach(path)
        self._link_count_changed(inode)

    def _link_count_changed(self, inode: int | None) -> None:
        """A name of the file `inode` went: its other names show the new link count at once here
        (the kernel drops the count of its inode itself and asks again)."""
        if inode is not None:
            self.ns.forget_attributes(self.inodes.names(inode))

    @_fuse_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        attr = await self._give_to_caller(path, await self.ns.symlink(os.fsdecode(target), path), ctx)
        return self._entry(self.inodes.remember(path, self.ns.me, attr), attr)

    @_fuse_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        src = self._child(parent_inode_old, name_old)
        dst = self._child(parent_inode_new, name_new)
        replaced = self.inodes.inode(dst)
        if ctx.uid != 0:
            await self._check_sticky_target(dst, ctx)
        is_dir = await self.ns.rename(src, dst, flags)
        self.inodes.rename(src, dst, is_dir)
        self._link_count_changed(replaced)

    async def _check_sticky_target(self, dst: str, ctx: pyfuse3.RequestContext) -> None:
        """EPERM for a rename over another user's `dst` in a sticky directory, as the kernel checks when
        it knows `dst`: here it did not (it had the name cached as missing, and another node made
        it meanwhile), and the daemon would replace it with its own rights."""
        directory = (await self.ns.lookup(dst.rsplit("/", 1)[0] or "/")).attr
        if not directory.mode & stat.S_ISVTX or directory.uid == ctx.uid:
            return
        for target in await self.ns.where(dst):  # past the caches: one that said "not found" may be why
            if target.attr.uid != ctx.uid:
                raise PermissionError(errno.EPERM, f"{dst} is another user's in a sticky directory "
                                                   f"(on node {target.node})")

    # -- files ---------------------------------------------------------------

    @_fuse_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        handle = await self.ns.open(self.inodes.path(inode), flags)
        drop_setgid = flags & os.O_ACCMODE != os.O_RDONLY and _drops_setgid(handle.attr, ctx)
        if drop_setgid and flags & os.O_TRUNC:  # truncated by the open already
            try:
                handle.attr = await self.ns.setattr(handle.path, mode=handle.attr.mode & ~stat.S_ISGID, handle=handle)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self.ns.release(handle, named=False)
                raise
        info = await self._file_info(inode, handle, flags)
        if drop_setgid and not flags & os.O_TRUNC:
            self._drop_setgid_at_write.add(info.fh)
        return info

    async def _file_info(self, inode: int, handle: FileHandle, flags: int) -> pyfuse3.FileInfo:
        """Close-to-open, against what the kernel holds: `handle.attr` is fresh from the holder.

        Pages are kept only if the file is unchanged since the last open here (otherwise
        the kernel drops them itself at this open: no keep_cache). If the kernel was told
        other attributes (size!) they are invalidated, so a read is never cut at a stale
        size. Attributes only: dropping pages from here would wait for page locks, which
        reads in flight on this inode hold until this daemon answers them.
        """
        version = _version(handle.attr)
        keep = self._opened_version.get(inode) == version
        if self._told.get(inode) != version:
            # In a worker thread, as invalidate_entry: the kernel call touches no page, but it
            # looks the inode up, which waits while the kernel evicts it -- and an eviction can
            # wait for a read this daemon has yet to answer. On the event loop that would stall
            # the node; here the open goes on after KERNEL_NOTIFY_WAIT.
            with trio.move_on_after(KERNEL_NOTIFY_WAIT) as waited:
                await trio.to_thread.run_sync(_invalidate_inode, inode, True, abandon_on_cancel=True,
                                              limiter=self._entry_limiter)
            if waited.cancelled_caught:
                log.warning("the kernel did not drop its attributes of inode %d within %.1f s; "
                            "its size may show stale until attr_ttl", inode, KERNEL_NOTIFY_WAIT)
            self._told[inode] = version
        self._opened_version[inode] = version
        fh = self._new_fh()
        self._files[fh] = handle
        self._inode_of[fh] = inode
        self._open.setdefault(inode, set()).add(fh)
        info = pyfuse3.FileInfo(fh=fh)
        info.keep_cache = keep
        if self.passthrough is not None and self.passthrough.opened(inode, fh, handle.fd):
            # the kernel writes the export file itself, unseen here: release reports it as written
            handle.wrote = handle.wrote or flags & os.O_ACCMODE != os.O_RDONLY
        return info

    @_fuse_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._child(parent_inode, name)
        handle = await self.ns.create(path, flags, mode & ~ctx.umask,
                                      check_existing=lambda attr: _check_open(attr, flags, ctx))
        inode: int | None = None
        try:
            if handle.created:  # not an existing file another node had made meanwhile
                handle.attr = await self._give_to_caller(path, handle.attr, ctx)
            inode = self.inodes.remember(path, handle.node, handle.attr)
            entry = self._entry(inode, handle.attr)
            return await self._file_info(inode, handle, flags), entry
        except BaseException:
            # The kernel gets neither the entry nor the handle, so it never forgets or releases
            # them: take the lookup back and close the file here (it stays made, as a failed
            # open(O_CREAT) may leave it).
            if inode is not None:
                self.inodes.forget(inode, 1)
            with trio.CancelScope(shield=True):
                await self._release_unused(handle)
            raise

    async def _release_unused(self, handle: FileHandle) -> None:
        try:
            await self.ns.release(handle)
        except Exception as exc:
            log.warning("could not close %s after its create failed: %s", handle.path, exc)

    @_fuse_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._files[fh]
        data = await self.ns.read(handle, off, size)
        self.counters.mount_read(handle.fd is not None, len(data))  # fd: served from this node's export
        return data

    @_fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._files[fh]
        if fh in self._drop_setgid_at_write:
            self._drop_setgid_at_write.discard(fh)
            mode = (await self.ns.fstat(handle)).mode
            if mode & (stat.S_ISGID | stat.S_IXGRP) == stat.S_ISGID:
                await self.ns.setattr(self.inodes.path(self._inode_of[fh]), mode=mode & ~stat.S_ISGID, handle=handle)
        written = await self.ns.write(handle, off, buf)
        self.counters.mount_write(handle.fd is not None, written)
        others = self._open.get(self._inode_of[fh], ())
        self.ns.drop_read_ahead(self._files[other] for other in others if other != fh)
        return written

    @_fuse_errors
    async def flush(self, fh: int) -> None:
        # Writes go straight to the holder, nothing is buffered here; but a write that got no reply
        # is settled, and a written file announced, so that close(2) returning means every write has
        # landed or never will, and the directory's home knows the file's new size and times.
        handle = self._files.get(fh)
        if handle is not None:
            await self.ns.flush(handle, named=self._name_now(handle, self._inode_of[fh]))

    def _name_now(self, handle: FileHandle, inode: int) -> bool:
        """Give `handle` the name its file has now (renamed through this node while open); False when
        that name is not this file's any more (unlinked or renamed over while open)."""
        handle.path = self.inodes.path(inode)
        return self.inodes.inode(handle.path) == inode

    @_fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.ns.fsync(self._files[fh], datasync)

    @_fuse_errors
    async def release(self, fh: int) -> None:
        if self.passthrough is not None:
            self.passthrough.released(fh)
        handle = self._files.pop(fh)
        self._drop_setgid_at_write.discard(fh)
        inode = self._inode_of.pop(fh)
        handles = self._open.get(inode)
        if handles is not None:
            handles.discard(fh)
            if not handles:
                del self._open[inode]
        final = await self.ns.release(handle, named=self._name_now(handle, inode))
        if handle.wrote:
            # Our own writes changed mtime: remember the new version so our next open keeps the cache.
            if final is None:
                self._opened_version.pop(inode, None)
            else:
                self._opened_version[inode] = _version(final)

    # -- extended attributes ----------------------------------------------------------

    @_fuse_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if inode == ROOT_INODE and name == b"user.gmount.bypass" and self.bypass_xattr is not None:
            return self.bypass_xattr
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

    # -- special files, hard links, owners of new files --------------------------------

    @_fuse_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        attr = await self.ns.mknod(path, mode & ~ctx.umask, rdev)
        attr = await self._give_to_caller(path, attr, ctx)
        return self._entry(self.inodes.remember(path, self.ns.me, attr), attr)

    @_fuse_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        dst = self._child(new_parent_inode, new_name)
        attr = await self.ns.link(self.inodes.path(inode), dst)
        return self._entry(self.inodes.remember(dst, self.ns.me, attr), attr)  # `inode` again: one file

    async def _give_to_caller(self, path: str, attr: Attr, ctx: pyfuse3.RequestContext) -> Attr:
        """A root daemon serving other users (allow_other) makes their new files theirs, as the
        kernel would; a non-root daemon cannot, so their files belong to the daemon's user."""
        if os.geteuid() != 0 or (attr.uid, attr.gid) == (ctx.uid, ctx.gid):
            return attr
        parent = path.rsplit("/", 1)[0] or "/"
        setgid_parent = bool((await self.ns.lookup(parent)).attr.mode & stat.S_ISGID)
        return await self.ns.chown(path, ctx.uid, -1 if setgid_parent else ctx.gid)


__all__ = ["GmountOperations", "ROOT_INODE"]
