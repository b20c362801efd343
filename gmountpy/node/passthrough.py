"""Kernel FUSE passthrough for this node's own files, where the daemon may use it.

Linux 6.9 can read and write a file opened through a FUSE mount on a backing file the
daemon hands it, without a READ or WRITE request ever reaching the daemon: a local file
is then read at disk speed by every program, static binaries included (the local-access
paper, seed 001, upstream). Registering a backing file needs CAP_SYS_ADMIN, so this is for
daemons run as root; unprivileged daemons leave local data to the jobs' preload library
(bypass.py). libfuse 3.14 and pyfuse3 cannot ask for passthrough: the C library next to
this module (`libgmount_passthrough.so`, csrc/gmount_passthrough.c) amends the INIT and
OPEN/CREATE replies on their way to the kernel. It must be loaded before pyfuse3
(`preload()`, from the daemon's __main__).

The kernel wants every open of an inode in one mode: while passthrough opens exist, all
opens of that inode use passthrough on the same backing file; while cached opens (served
by the daemon) exist, none may. `Passthrough` keeps that bookkeeping per inode.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
from dataclasses import dataclass

log = logging.getLogger(__name__)

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgmount_passthrough.so")
_lib: ctypes.CDLL | None = None


def preload() -> None:
    """Load the library into the process's global scope; call before pyfuse3 is imported.

    Loading changes nothing by itself: the session I/O is only routed through it once
    `Passthrough.arm()` was called before the mount.
    """
    global _lib
    if _lib is not None or not os.path.exists(LIBRARY):
        return
    try:
        _lib = ctypes.CDLL(LIBRARY, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as exc:
        log.info("kernel passthrough unavailable: %s", exc)
        return
    _lib.gmount_pt_backing_open.argtypes = [ctypes.c_int]
    _lib.gmount_pt_backing_close.argtypes = [ctypes.c_int]
    _lib.gmount_pt_offer.argtypes = [ctypes.c_uint64, ctypes.c_int]
    _lib.gmount_pt_forget.argtypes = [ctypes.c_uint64]
    _lib.gmount_pt_amended.restype = ctypes.c_long


def _kernel_has_passthrough() -> bool:
    release = platform.release().split(".")
    try:
        return (int(release[0]), int(release[1].split("-")[0])) >= (6, 9)
    except (IndexError, ValueError):
        return False


def _has_sys_admin() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 21))  # CAP_SYS_ADMIN
    except OSError:
        pass
    return False


def why_not() -> str | None:
    """Why this daemon cannot use kernel passthrough, or None when it can try."""
    if _lib is None:
        return f"{LIBRARY} was not loaded before pyfuse3"
    if not _kernel_has_passthrough():
        return f"the kernel ({platform.release()}) is older than 6.9"
    if not _has_sys_admin():
        return "the daemon lacks CAP_SYS_ADMIN (only root daemons may register backing files)"
    return None


@dataclass
class _Backing:
    backing_id: int
    opens: int


class Passthrough:
    """Which open handles the kernel serves itself, per inode (see the module docstring)."""

    def __init__(self) -> None:
        self._backing: dict[int, _Backing] = {}     # inode -> its backing file while passthrough opens exist
        self._cached: dict[int, int] = {}           # inode -> open handles served by the daemon
        self._handles: dict[int, int] = {}          # fh -> inode, for passthrough handles
        self._cached_handles: dict[int, int] = {}   # fh -> inode, for the others
        self._usable = False
        self._refused = False
        self.opens = 0                              # handles given to the kernel (statistics)

    @classmethod
    def arm(cls) -> Passthrough | None:
        """Before the mount: have the library amend the session's replies; None when it cannot."""
        problem = why_not()
        if problem is not None:
            log.info("kernel passthrough off: %s", problem)
            return None
        assert _lib is not None
        _lib.gmount_pt_arm()
        return cls()

    def _ready(self) -> bool:
        if self._refused:
            return False
        if not self._usable:
            assert _lib is not None
            self._usable = bool(_lib.gmount_pt_negotiated())
            if self._usable:
                log.info("kernel passthrough negotiated: this node's files are read and written by the kernel")
        return self._usable

    def opened(self, inode: int, fh: int, fd: int | None) -> bool:
        """A handle was opened on `inode` (`fd`: this node's file, None for another node's).
        True when its reply asks the kernel for passthrough."""
        if fd is None or self._cached.get(inode, 0) or not self._ready():
            return self._opened_cached(inode, fh)
        assert _lib is not None
        backing = self._backing.get(inode)
        if backing is None:
            backing_id = _lib.gmount_pt_backing_open(fd)
            if backing_id <= 0:
                if backing_id == -errno.EPERM:
                    log.warning("kernel passthrough refused (EPERM): this daemon may not register backing files; "
                                "local files are served by the daemon")
                    self._refused = True
                else:
                    log.info("no passthrough for inode %d: %s", inode, os.strerror(-backing_id))
                return self._opened_cached(inode, fh)
            backing = self._backing[inode] = _Backing(backing_id, 0)
        if _lib.gmount_pt_offer(fh, backing.backing_id) != 0:
            if backing.opens == 0:
                self._close(inode, backing)
            return self._opened_cached(inode, fh)
        backing.opens += 1
        self._handles[fh] = inode
        self.opens += 1
        return True

    def _opened_cached(self, inode: int, fh: int) -> bool:
        if inode in self._backing:
            # Passthrough opens of this inode exist (another holder's file by the same name now?):
            # the kernel would refuse a cached open. Give it the same backing file.
            assert _lib is not None
            backing = self._backing[inode]
            if _lib.gmount_pt_offer(fh, backing.backing_id) == 0:
                backing.opens += 1
                self._handles[fh] = inode
                return True
        self._cached[inode] = self._cached.get(inode, 0) + 1
        self._cached_handles[fh] = inode
        return False

    def released(self, fh: int) -> None:
        inode = self._handles.pop(fh, None)
        if inode is not None:
            assert _lib is not None
            _lib.gmount_pt_forget(fh)
            backing = self._backing[inode]
            backing.opens -= 1
            if backing.opens == 0:
                self._close(inode, backing)
            return
        inode = self._cached_handles.pop(fh, None)
        if inode is not None:
            left = self._cached[inode] - 1
            if left:
                self._cached[inode] = left
            else:
                del self._cached[inode]

    def _close(self, inode: int, backing: _Backing) -> None:
        assert _lib is not None
        del self._backing[inode]
        result = _lib.gmount_pt_backing_close(backing.backing_id)
        if result != 0:
            log.info("closing backing file %d of inode %d: %s", backing.backing_id, inode, os.strerror(-result))

    def statistics(self) -> dict[str, int]:
        amended = int(_lib.gmount_pt_amended()) if _lib is not None else 0
        return {"passthrough_opens": self.opens, "passthrough_replies": amended,
                "passthrough_inodes": len(self._backing)}


__all__ = ["LIBRARY", "Passthrough", "preload", "why_not"]
