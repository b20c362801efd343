"""The owner marks of directories in a node's export (see `owners`): an extended attribute
`OWNER_XATTR` = "TOKEN PATH" on the directory, this daemon's token and the directory's path;
a job creates there only under a shared `flock` of the directory with the mark in place, and
the daemon ends an ownership by taking the mark off and then an exclusive `flock`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import stat

import trio

from ..export import Export

log = logging.getLogger(__name__)

#: The mark of an owned directory in the export: "TOKEN PATH".
OWNER_XATTR = "user.gmount.owner"
#: How long the end of an ownership waits for the creates jobs have under way (each takes
#: microseconds; only a job stopped in the middle of one holds it longer).
CREATES_WAIT = 5.0


class Owners:
    """The marks and locks of owned directories in this node's export."""

    def __init__(self, export: Export, token: str | None = None) -> None:
        self.export = export
        self.token = token or secrets.token_hex(8)
        #: False once the export's file system refused the mark: nothing is owned then.
        self.usable = True

    def value(self, directory: str) -> bytes:
        return f"{self.token} {directory}".encode("utf-8", "surrogateescape")

    def _open(self, directory: str) -> int:
        """A descriptor of `directory` in the export, walked without following symlinks."""
        fd = self.export.open(directory, os.O_RDONLY)
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotADirectoryError(errno.ENOTDIR, f"{directory} is not a directory in the export")
        return fd

    def mark(self, directory: str) -> bool:
        """Put the mark on `directory`; False when it cannot be (not here, no xattrs there)."""
        if not self.usable or directory == "/":
            return False
        try:
            fd = self._open(directory)
        except OSError:
            return False
        try:
            os.setxattr(fd, OWNER_XATTR, self.value(directory))
            return True
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                log.info("the export's file system keeps no extended attributes: jobs create through the "
                         "mount (%s)", exc)
                self.usable = False
            return False
        finally:
            os.close(fd)

    def marked(self, directory: str) -> bool:
        try:
            fd = self._open(directory)
        except OSError:
            return False
        try:
            return os.getxattr(fd, OWNER_XATTR) == self.value(directory)
        except OSError:
            return False
        finally:
            os.close(fd)

    async def unmark(self, directory: str, *, wait: float = CREATES_WAIT) -> None:
        """Take the mark off `directory`, then wait until no job has a create under way in it
        (the exclusive lock): from then on every create there goes through the mount. Raises
        EIO when a job holds the directory's lock for `wait` seconds (stopped in a create)."""
        try:
            fd = self._open(directory)
        except OSError:
            return  # gone from the export (removed, renamed): nothing can be created in it by that name
        try:
            try:
                os.removexattr(fd, OWNER_XATTR)
            except OSError as exc:
                if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
            deadline = trio.current_time() + wait
            pause = 0.0001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if trio.current_time() >= deadline:
                        raise OSError(errno.EIO, f"a job on this node has held the lock of {directory} for "
                                                 f"{wait:g} s in the middle of a create; try again") from None
                    await trio.sleep(pause)
                    pause = min(2 * pause, 0.01)
        finally:
            os.close(fd)  # (the lock goes with it)

    def unmark_moved(self, old: str, new: str) -> None:
        """`old`, owned, was renamed to `new`: its mark (naming `old`) goes, so that a rename back
        cannot make it valid again."""
        try:
            fd = self._open(new)
        except OSError:
            return
        try:
            if os.getxattr(fd, OWNER_XATTR) == self.value(old):
                os.removexattr(fd, OWNER_XATTR)
        except OSError:
            pass
        finally:
            os.close(fd)
