"""The front door for a node's directories: refuse a missing export or a busy mountpoint,
and keep the directory under a mount unwritable while the mount covers it.

Used by the daemon before it mounts, and by the local launcher before it
starts anything (no FUSE import here, so the launcher stays light).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import sys

from ..cluster.config import NodeSpec

log = logging.getLogger(__name__)


def directory_problems(node: NodeSpec) -> list[str]:
    """What is wrong with a node's export and mountpoint on this machine, one line each.

    A missing export is refused unless `create_export` is set: a typo in the
    cluster file must not quietly export a new, empty directory while the
    user's data sits elsewhere. A mountpoint must be an empty directory (or
    not exist yet: it is made).
    """
    problems = []
    export, mountpoint = node.export, node.mountpoint
    if not os.path.lexists(export):
        if not node.create_export:
            problems.append(f"export {export} does not exist: create it, fix `export` in the "
                            "cluster file, or set create_export = true to have it made")
    elif not os.path.isdir(export):
        problems.append(f"export {export} is not a directory")
    elif not os.access(export, os.R_OK | os.X_OK):
        problems.append(f"export {export} is not readable by this user")
    try:
        if os.path.lexists(mountpoint) and not os.path.ismount(mountpoint):
            if not os.path.isdir(mountpoint):
                problems.append(f"mountpoint {mountpoint} exists and is not a directory: "
                                "choose an empty directory")
            elif os.listdir(mountpoint):
                problems.append(f"mountpoint {mountpoint} is not empty: choose an empty "
                                "directory")
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:  # a stale mount is reported (with its remedy) by _prepare_dirs
            problems.append(f"mountpoint {mountpoint} is not usable ({exc.strerror})")
    return problems


# -- the directory under a mount --------------------------------------------------------------
#
# While a node's mount covers its mountpoint, the directory underneath is unwritable
# ("sealed"): without write bits, and for root (whom modes do not stop) immutable too. So
# when the daemon dies and its dead mount is cleared -- by `gmount up` replacing it, or a
# lazy unmount -- the bare directory that shows takes no files: a writer gets an error
# instead of writing into the disk under the mountpoint, where the next mount would hide
# what it wrote. A new daemon mounts over the sealed directory (root: as it is; others
# need write access for fusermount3, given back just before mounting) and seals it again;
# a clean unmount, or `gmount down`, unseals it (docs/failures.md).

#: The directory's own mode before it was sealed (an octal string), kept on the directory.
MODE_XATTR = "user.gmount.mountpoint_mode"
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_IMMUTABLE_FL = 0x10
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def _flags(fd: int) -> int | None:
    try:
        return int.from_bytes(fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(4)), sys.byteorder, signed=True)
    except OSError:
        return None  # a file system without inode flags


def _set_immutable(fd: int, on: bool) -> bool:
    flags = _flags(fd)
    if flags is None:
        return False
    wanted = flags | _FS_IMMUTABLE_FL if on else flags & ~_FS_IMMUTABLE_FL
    if wanted != flags:
        try:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, wanted.to_bytes(4, sys.byteorder, signed=True))
        except OSError:
            return False
    return True


def _recorded_mode(fd: int) -> int | None:
    try:
        return int(os.getxattr(fd, MODE_XATTR), 8) & 0o7777
    except (OSError, ValueError):
        return None


def unseal(fd: int) -> None:
    """Give a sealed directory back its mode (writable again); harmless on one never sealed."""
    flags = _flags(fd)
    if flags is not None and flags & _FS_IMMUTABLE_FL:
        _set_immutable(fd, False)
    recorded = _recorded_mode(fd)
    if recorded is None and not _sealed_mode(fd):
        return
    os.fchmod(fd, recorded if recorded is not None else stat.S_IMODE(os.fstat(fd).st_mode) | stat.S_IWUSR)
    try:
        os.removexattr(fd, MODE_XATTR)
    except OSError:
        pass


def _sealed_mode(fd: int) -> bool:
    return not stat.S_IMODE(os.fstat(fd).st_mode) & _WRITE_BITS


def unseal_mountpoint(path: str) -> None:
    """`gmount down` after a daemon died: its bare mountpoint becomes an ordinary directory again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        unseal(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class MountpointSeal:
    """The daemon's hold on the directory under its mount: opened before mounting, sealed after.

    The descriptor keeps reaching the directory underneath once the mount covers its
    path, so `seal` and `unseal` act on it, not on the mount.
    """

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        self._fd: int | None = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        flags = _flags(self._fd) or 0
        self._was_sealed = (_recorded_mode(self._fd) is not None or bool(flags & _FS_IMMUTABLE_FL)
                            or (os.geteuid() != 0 and _sealed_mode(self._fd)))
        if os.geteuid() != 0 and self._was_sealed:
            # fusermount3 wants write access to the mountpoint: given back for the moment of
            # mounting (root mounts over the sealed directory as it is)
            unseal(self._fd)

    def seal(self) -> None:
        """The mount is in place: make the directory under it unwritable."""
        fd = self._require()
        try:
            if _recorded_mode(fd) is None and not _sealed_mode(fd):
                try:
                    os.setxattr(fd, MODE_XATTR, oct(stat.S_IMODE(os.fstat(fd).st_mode)).encode())
                except OSError:
                    pass  # no user xattrs here: unsealing gives back the owner's write bit only
            flags = _flags(fd)
            if flags is None or not flags & _FS_IMMUTABLE_FL:
                os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~_WRITE_BITS)
            if os.geteuid() == 0:
                _set_immutable(fd, True)
        except OSError as exc:
            log.warning("could not make %s unwritable under its mount (%s): if this node's daemon dies, "
                        "files written there until `gmount up` land on the disk under it", self.mountpoint, exc)
        try:
            stray = os.listdir(fd)
        except OSError:
            stray = []
        if stray:
            log.warning("%d entries were written into %s while it was being mounted (%s): they are hidden under "
                        "the mount; see them after `gmount down`", len(stray), self.mountpoint,
                        ", ".join(sorted(stray)[:5]))

    def unseal(self) -> None:
        """Unmounted cleanly: the directory becomes an ordinary, writable one again."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            unseal(fd)
        except OSError as exc:
            log.warning("could not make %s writable again after unmounting: %s", self.mountpoint, exc)
        finally:
            os.close(fd)

    def close(self) -> None:
        """The mount failed: leave the directory as it was found (sealed again if it was)."""
        if self._fd is not None and self._was_sealed:
            self.seal()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _require(self) -> int:
        if self._fd is None:
            raise ValueError(f"the seal of {self.mountpoint} was already released")
        return self._fd
