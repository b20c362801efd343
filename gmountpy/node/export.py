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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

_WALK_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Flags a caller may pass to open(); O_DIRECT is dropped because the page
#: cache and pread with arbitrary offsets are how the daemon reads.
_OPEN_MASK = (os.O_ACCMODE | os.O_APPEND | os.O_TRUNC | os.O_NONBLOCK | os.O_SYNC
              | os.O_DSYNC | os.O_NOATIME)


class Attr(NamedTuple):
    """The attributes of one file as they travel between nodes."""

    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    blocks: int
    blksize: int
    rdev: int

    @classmethod
    def from_stat(cls, st: os.stat_result) -> Attr:
        return cls(st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size, st.st_atime_ns,
                   st.st_mtime_ns, st.st_ctime_ns, st.st_blocks, st.st_blksize, st.st_rdev)

    @classmethod
    def from_wire(cls, value: list[int] | tuple[int, ...]) -> Attr:
        if len(value) != len(cls._fields) or not all(isinstance(v, int) for v in value):
            raise ValueError(f"malformed attributes: {value!r}")
        return cls(*value)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)


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

    def close(self) -> None:
        os.close(self._root_fd)

    # -- walking -----------------------------------------------------------

    @contextmanager
    def _dir(self, parts: list[str], create: bool = False) -> Iterator[int]:
        """A descriptor of the directory named by `parts`, walked without following symlinks."""
        fd = self._root_fd
        opened: list[int] = []
        try:
            for part in parts:
                try:
                    fd = os.open(part, _WALK_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
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
    def _parent(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        parts = split_path(path)
        if not parts:
            raise OSError(errno.EBUSY, "the export root cannot be changed this way")
        with self._dir(parts[:-1], create) as fd:
            yield fd, parts[-1]

    def local_path(self, path: str) -> str:
        """The file's path on this node's disk (for bypassing FUSE), checked to exist."""
        self.lstat(path)
        return os.path.join(self.root, *split_path(path))

    # -- metadata ----------------------------------------------------------

    def lstat(self, path: str) -> Attr:
        parts = split_path(path)
        if not parts:
            return Attr.from_stat(os.stat(self._root_fd))
        with self._dir(parts[:-1]) as fd:
            return Attr.from_stat(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False))

    def listdir(self, path: str) -> list[tuple[str, Attr]]:
        """Entries of a directory with their attributes (one pass, for readdirplus)."""
        with self._dir(split_path(path)) as parent:
            fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
        try:
            entries = []
            with os.scandir(fd) as it:
                for entry in it:
                    try:
                        entries.append((entry.name, Attr.from_stat(entry.stat(follow_symlinks=False))))
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
            return os.open(name, (flags & _OPEN_MASK) | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)

    def create(self, path: str, flags: int, mode: int, parents: bool = True) -> int:
        """Create (or open) a file, making missing parent directories in this export."""
        with self._parent(path, create=parents) as (fd, name):
            return os.open(name, (flags & _OPEN_MASK) | os.O_CREAT | (flags & os.O_EXCL)
                           | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)

    def mkdir(self, path: str, mode: int, parents: bool = True) -> Attr:
        with self._parent(path, create=parents) as (fd, name):
            os.mkdir(name, mode, dir_fd=fd)
            return Attr.from_stat(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def symlink(self, target: str, path: str) -> Attr:
        if "\0" in target:
            raise OSError(errno.EINVAL, "symlink target contains a NUL byte")
        with self._parent(path, create=True) as (fd, name):
            os.symlink(target, name, dir_fd=fd)
            return Attr.from_stat(os.stat(name, dir_fd=fd, follow_symlinks=False))

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

    def chmod(self, path: str, mode: int) -> Attr:
        with self._parent(path) as (fd, name):
            try:
                os.chmod(name, mode, dir_fd=fd, follow_symlinks=False)
            except (NotImplementedError, ValueError):
                raise OSError(errno.EOPNOTSUPP, "cannot change the mode of a symlink") from None
            return Attr.from_stat(os.stat(name, dir_fd=fd, follow_symlinks=False))

    def truncate(self, path: str, size: int) -> Attr:
        fd = self.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            return Attr.from_stat(os.fstat(fd))
        finally:
            os.close(fd)

    def utimens(self, path: str, atime_ns: int | None, mtime_ns: int | None) -> Attr:
        """Set times; None keeps that time as it is."""
        with self._parent(path) as (fd, name):
            current = os.stat(name, dir_fd=fd, follow_symlinks=False)
            times = (current.st_atime_ns if atime_ns is None else atime_ns,
                     current.st_mtime_ns if mtime_ns is None else mtime_ns)
            os.utime(name, ns=times, dir_fd=fd, follow_symlinks=False)
            return Attr.from_stat(os.stat(name, dir_fd=fd, follow_symlinks=False))

    # -- extended attributes (user namespace of the holder's file) ----------

    @contextmanager
    def _xattr_fd(self, path: str) -> Iterator[int]:
        parts = split_path(path)
        with self._dir(parts[:-1]) as parent:
            name = parts[-1] if parts else "."
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            yield fd
        finally:
            os.close(fd)

    def getxattr(self, path: str, name: str) -> bytes:
        with self._xattr_fd(path) as fd:
            return os.getxattr(fd, name)

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        with self._xattr_fd(path) as fd:
            os.setxattr(fd, name, value)

    def listxattr(self, path: str) -> list[str]:
        with self._xattr_fd(path) as fd:
            return os.listxattr(fd)

    def removexattr(self, path: str, name: str) -> None:
        with self._xattr_fd(path) as fd:
            os.removexattr(fd, name)
