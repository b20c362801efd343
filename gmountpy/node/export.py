"""The node's export directory: the only code that touches the node's disk.

Every path is a namespace path ("/a/b"). It is split into components, each
checked (no "", ".", "..", NUL, "/"), and walked one directory at a time
with O_NOFOLLOW relative to a descriptor of the export root. Symlinks are
therefore never followed -- not in the middle of a path, not at its end,
not even when swapped in during a request -- so no request can reach a
file outside the export. The kernel resolves symlinks itself through the
mount, so the daemon never needs to follow them.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import trio

from ..protocol.attr import Attr

T = TypeVar("T")

_WALK_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Flags a caller may pass to open(); O_DIRECT is dropped because the page
#: cache and pread with arbitrary offsets are how the daemon reads.
_OPEN_MASK = (os.O_ACCMODE | os.O_APPEND | os.O_TRUNC | os.O_NONBLOCK | os.O_SYNC
              | os.O_DSYNC | os.O_NOATIME)


#: Disk calls of the export run in at most this many worker threads at once, so a slow
#: disk (or a stuck network file system under the export) delays only the calls that
#: touch it, never the event loop that serves every other request.
DISK_THREADS = 16
_disk_limiter: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("gmount_disk_limiter")


async def off_loop(func: Callable[..., T], *args: Any) -> T:
    """Run one blocking disk call in a worker thread (about 0.1 ms a hop on this machine).

    Used for every call that can wait on the disk; reads of cached pages avoid
    the hop entirely (see `pread`).
    """
    try:
        limiter = _disk_limiter.get()
    except LookupError:
        limiter = trio.CapacityLimiter(DISK_THREADS)
        _disk_limiter.set(limiter)
    return await trio.to_thread.run_sync(func, *args, limiter=limiter)


#: Buffers reused by the reads done on the event loop (one at a time), one per request size:
#: preadv into an exact-size bytearray is as fast as pread; into a slice of a bigger one, 6x slower.
_read_buffers: dict[int, bytearray] = {}


async def pread(fd: int, size: int, offset: int) -> bytes:
    """pread that stays on the event loop only when the pages are cached (RWF_NOWAIT).

    A read the kernel would have to wait for -- pages not cached, a slow disk --
    answers EAGAIN (or comes back short) instead of blocking, and is then done
    in a worker thread. Reads of recently written or re-read files, the common
    case, cost no thread hop.
    """
    if size <= 0:
        return b""
    buffer = _read_buffers.get(size)
    if buffer is None:
        if len(_read_buffers) >= 8:
            _read_buffers.clear()
        buffer = _read_buffers[size] = bytearray(size)
    try:
        got = os.preadv(fd, [buffer], offset, os.RWF_NOWAIT)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        got = -1
    if got == size:
        return bytes(buffer)
    if got >= 0 and offset + got >= os.fstat(fd).st_size:  # short because of the end of file
        return bytes(buffer[:got])
    return await off_loop(os.pread, fd, size, offset)


_nowait_writes = True  # False once the file system said RWF_NOWAIT writes are not supported


async def pwrite(fd: int, data: bytes, offset: int) -> int:
    """pwrite that waits in a worker thread: a write can wait for writeback or a slow disk.

    File systems that support RWF_NOWAIT for buffered writes (xfs, btrfs) take
    the write on the event loop when it cannot block; ext4 says EOPNOTSUPP once
    and every write then goes to a thread.
    """
    global _nowait_writes
    if _nowait_writes:
        try:
            written = os.pwritev(fd, [data], offset, os.RWF_NOWAIT)
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                _nowait_writes = False
            elif exc.errno != errno.EAGAIN:
                raise
        else:
            if written == len(data):
                return written
            try:
                return written + await off_loop(os.pwrite, fd, data[written:], offset + written)
            except OSError:
                if written:
                    return written  # a short write (POSIX): the bytes that did land, not an error
                raise
    return await off_loop(os.pwrite, fd, data, offset)


#: The longest file name (in bytes) the file systems under an export take.
NAME_MAX = 255


def temporary_name(path: str, kind: str) -> str:
    """A hidden name beside `path` for a file being written, `.NAME.gmount-KIND-XXXXXXXX`.

    NAME is cut (at a character boundary) so the whole name fits NAME_MAX, so any name that
    fits gets a temporary that fits too.
    """
    directory, slash, name = path.rpartition("/")
    suffix = f".gmount-{kind}-{uuid.uuid4().hex[:8]}"
    room = NAME_MAX - 1 - len(suffix)
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > room:
        name = raw[:room].decode("utf-8", "ignore")
    return f"{directory}{slash}.{name}{suffix}"


def open_special_safely(open_call: Callable[[int], int], flags: int) -> int:
    """Open with O_NONBLOCK so a FIFO without a peer never blocks; regular files get back
    the blocking mode they asked for, special files (FIFO, device) stay non-blocking."""
    fd = open_call(flags | os.O_NONBLOCK)
    if not flags & os.O_NONBLOCK:
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.set_blocking(fd, True)
        except OSError:
            os.close(fd)
            raise
    return fd


def split_path(path: str) -> list[str]:
    """Components of a namespace path, refusing anything that could escape."""
    if not isinstance(path, str):
        raise OSError(errno.EINVAL, f"path must be a string, not {type(path).__name__}")
    if not path.startswith("/"):
        raise OSError(errno.EINVAL, f"path {path!r} is not absolute in the namespace")
    if "\0" in path:
        raise OSError(errno.EINVAL, "path contains a NUL byte")
    if path == "/":
        return []
    parts = path[1:].split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise OSError(errno.EINVAL, f"path {path!r} has a forbidden component {part!r}")
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            raise OSError(errno.ENAMETOOLONG, f"component of {path!r} is longer than 255 bytes")
    return parts


def _check_name(name: str) -> str:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise OSError(errno.EINVAL, f"invalid file name {name!r}")
    return name


class Export:
    """Confined operations on one export root."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self._root_fd = os.open(self.root, _WALK_FLAGS & ~os.O_NOFOLLOW)
        #: The device of the export's own file system: its files' `Attr.dev` is 0 (see Attr).
        self.dev = os.fstat(self._root_fd).st_dev

    def attr(self, st: os.stat_result) -> Attr:
        """The attributes of a stat of one of this export's files (or of an open descriptor of one)."""
        return Attr.from_stat(st, self.dev)

    def close(self) -> None:
        os.close(self._root_fd)

    # -- walking -----------------------------------------------------------

    @contextmanager
    def _dir(self, parts: list[str], create: bool = False, made: list[str] | None = None) -> Iterator[int]:
        """A descriptor of the directory named by `parts`, walked without following symlinks.

        With `create`, missing directories are made; their paths are appended to `made`.
        """
        fd = self._root_fd
        opened: list[int] = []
        try:
            for depth, part in enumerate(parts):
                try:
                    fd = os.open(part, _WALK_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        if made is not None:
                            made.append("/" + "/".join(parts[:depth + 1]))
                    except FileExistsError:
                        pass
                    fd = os.open(part, _WALK_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:  # a symlink where a directory must be
                        raise OSError(errno.ENOTDIR, "not a directory") from None
                    raise
                opened.append(fd)
            yield fd
        finally:
            for each in opened:
                os.close(each)

    @contextmanager
    def _parent(self, path: str, create: bool = False, made: list[str] | None = None) -> Iterator[tuple[int, str]]:
        parts = split_path(path)
        if not parts:
            raise OSError(errno.EBUSY, "the export root cannot be changed this way")
        with self._dir(parts[:-1], create, made) as fd:
            yield fd, parts[-1]

    def local_path(self, path: str) -> str:
        """The file's path on this node's disk (for bypassing FUSE), checked to exist."""
        self.lstat(path)
        return os.path.join(self.root, *split_path(path))

    # -- metadata ----------------------------------------------------------

    def lstat(self, path: str) -> Attr:
        parts = split_path(path)
        if not parts:
            return self.attr(os.stat(self._root_fd))
        with self._dir(parts[:-1]) as fd:
            return self.attr(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False))

    def listdir(self, path: str) -> list[tuple[str, Attr]]:
        """Entries of a directory with their attributes (one pass, for readdirplus)."""
        with self._dir(split_path(path)) as parent:
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
        try:
            entries = []
            with os.scandir(fd) as it:
                for entry in it:
                    try:
                        entries.append((entry.name, self.attr(entry.stat(follow_symlinks=False))))
                    except FileNotFoundError:  # removed while listing
                        continue
            return entries
        finally:
            os.close(fd)

    def statfs(self) -> tuple[int, ...]:
        st = os.statvfs(self._root_fd)
        return (st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, st.f_files,
                st.f_ffree, st.f_favail, st.f_namemax)

    def readlink(self, path: str) -> str:
        with self._parent(path) as (fd, name):
            return os.readlink(name, dir_fd=fd)

    # -- files -------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        """Open an existing file; the descriptor is the caller's to close."""
        with self._parent(path) as (fd, name):
            return open_special_safely(
                lambda how: os.open(name, how, dir_fd=fd), (flags & _OPEN_MASK) | os.O_NOFOLLOW | os.O_CLOEXEC)

    def create(self, path: str, flags: int, mode: int, parents: bool = True, made: list[str] | None = None) -> int:
        """Create (or open) a file, making missing parent directories in this export (listed in `made`)."""
        with self._parent(path, create=parents, made=made) as (fd, name):
            return open_special_safely(
                lambda how: os.open(name, how, mode, dir_fd=fd),
                (flags & _OPEN_MASK) | os.O_CREAT | (flags & os.O_EXCL) | os.O_NOFOLLOW | os.O_CLOEXEC)

    def mkdir(self, path: str, mode: int, parents: bool = True) -> Attr:
        with self._parent(path, create=parents) as (fd, name):
            os.mkdir(name, mode, dir_fd=fd)
            return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def make_directory_like(self, path: str, mode: int, uid: int, gid: int) -> Attr:
        """A copy of a directory another node has, with its exact mode (umask, sticky and set-gid
        bits included) and, where this daemon may give it away, its owner: the kernel checks the
        permissions of the union's directory against the copy a node shows. Its parent must exist;
        a copy made meanwhile by another request is kept as it is."""
        with self._parent(path) as (fd, name):
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))
            current = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if (current.st_uid, current.st_gid) != (uid, gid):
                try:
                    os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
                except PermissionError:
                    pass  # a daemon that is not root keeps its own files: as its other creates
            os.chmod(name, stat.S_IMODE(mode), dir_fd=fd, follow_symlinks=False)  # after chown, which clears set-gid
            return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def symlink(self, target: str, path: str) -> Attr:
        if "\0" in target:
            raise OSError(errno.EINVAL, "symlink target contains a NUL byte")
        with self._parent(path, create=True) as (fd, name):
            os.symlink(target, name, dir_fd=fd)
            return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def mknod(self, path: str, mode: int, rdev: int) -> Attr:
        """A FIFO, socket or device node (as the export's file system allows for this user)."""
        if stat.S_IFMT(mode) not in (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFREG):
            raise OSError(errno.EINVAL, f"mknod of {path}: unsupported file type {stat.S_IFMT(mode):o}")
        with self._parent(path, create=True) as (fd, name):
            os.mknod(name, mode, rdev, dir_fd=fd)
            return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def link(self, src: str, dst: str) -> Attr:
        """link(2) inside this export: a second name for the same file; the new name's attributes."""
        with self._parent(src) as (src_fd, src_name):
            os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)  # fail before making dst's parents
            with self._parent(dst, create=True) as (dst_fd, dst_name):
                os.link(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
                return self.attr(os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False))

    def chown(self, path: str, uid: int, gid: int) -> Attr:
        """lchown(2): -1 keeps that id; the export's file system decides who may (EPERM otherwise)."""
        with self._parent(path) as (fd, name):
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
            return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def unlink(self, path: str) -> None:
        with self._parent(path) as (fd, name):
            os.unlink(name, dir_fd=fd)

    def rmdir(self, path: str) -> None:
        with self._parent(path) as (fd, name):
            os.rmdir(name, dir_fd=fd)

    def rename(self, src: str, dst: str) -> None:
        """rename(2) inside this export (atomic); creates the destination's parents."""
        with self._parent(src) as (src_fd, src_name):
            # A missing source must fail before the destination's parents are made, or a
            # failed rename would leave stray directories behind.
            os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
            with self._parent(dst, create=True) as (dst_fd, dst_name):
                os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

    def sync_parent(self, path: str) -> None:
        """fsync the directory holding `path`, so a rename into it survives a crash."""
        with self._dir(split_path(path)[:-1]) as parent:
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def sync_parents(self, path: str, made: list[str]) -> None:
        """fsync `path`'s directory and the directory of each of `made` (directories made for it):
        after a crash the file is there under its name, and so is every directory leading to it."""
        for each in sorted({path, *made}, key=lambda p: -p.count("/")):
            self.sync_parent(each)

    def chmod(self, path: str, mode: int) -> Attr:
        with self._parent(path) as (fd, name):
            try:
                os.chmod(name, mode, dir_fd=fd, follow_symlinks=False)
            except (NotImplementedError, ValueError):
                raise OSError(errno.EOPNOTSUPP, "cannot change the mode of a symlink") from None
            return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def truncate(self, path: str, size: int) -> Attr:
        fd = self.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            return self.attr(os.fstat(fd))
        finally:
            os.close(fd)

    def utimens(self, path: str, atime_ns: int | None, mtime_ns: int | None) -> Attr:
        """Set times; None keeps that time as it is."""
        with self._parent(path) as (fd, name):
            current = os.stat(name, dir_fd=fd, follow_symlinks=False)
            times = (current.st_atime_ns if atime_ns is None else atime_ns,
                     current.st_mtime_ns if mtime_ns is None else mtime_ns)
            os.utime(name, ns=times, dir_fd=fd, follow_symlinks=False)
            return self.attr(os.stat(name, dir_fd=fd, follow_symlinks=False))

    # -- extended attributes (user namespace of the holder's file) ----------

    @contextmanager
    def _xattr_target(self, path: str) -> Iterator[tuple[int | str, bool]]:
        """What the xattr calls act on: (descriptor of the file, True), or for a symlink --
        which cannot be opened without following it -- (its path through this process's
        descriptor of its walked directory, False): the l*xattr calls then act on the link
        itself, as on any file system (`ls -l` asks for security.selinux on every symlink)."""
        parts = split_path(path)
        with self._dir(parts[:-1]) as parent:
            name = parts[-1] if parts else "."
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                yield f"/proc/self/fd/{parent}/{name}", False  # the symlink, never its target
                return
        try:
            yield fd, True
        finally:
            os.close(fd)

    def getxattr(self, path: str, name: str) -> bytes:
        with self._xattr_target(path) as (target, follow):
            return os.getxattr(target, name, follow_symlinks=follow)

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        with self._xattr_target(path) as (target, follow):
            os.setxattr(target, name, value, follow_symlinks=follow)

    def listxattr(self, path: str) -> list[str]:
        with self._xattr_target(path) as (target, follow):
            return os.listxattr(target, follow_symlinks=follow)

    def removexattr(self, path: str, name: str) -> None:
        with self._xattr_target(path) as (target, follow):
            os.removexattr(target, name, follow_symlinks=follow)
