"""A job's create in a directory its node owns, as the preload library makes it (csrc/gmount_preload.c,
`create_owned`), in Python: what the index's model checks run as a job's create.

Under a shared flock of the directory in the export, with the owner mark ("TOKEN PATH", the
daemon's token) on it, the file is made straight in the export and nobody is told. `pause`
is awaited where another node's request may come in between (the library's steps are
system calls; in the model another task runs there).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Awaitable, Callable

import trio

from gmountpy.node.index import OWNER_XATTR


async def create_in_owned(export_root: str, token: str, path: str, flags: int, mode: int,
                          pause: Callable[[], Awaitable[None]]) -> int | None:
    """The new file's descriptor; None when the mount must make it (not owned, the name exists,
    any other error); FileExistsError for an existing name under O_EXCL."""
    directory = path.rpartition("/")[0] or "/"
    name = path.rpartition("/")[2]
    try:
        dfd = os.open(os.path.join(export_root, directory.lstrip("/")),
                      os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        while True:  # (the library blocks; the daemon holds the exclusive lock only to take it)
            try:
                fcntl.flock(dfd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await trio.sleep(0)
        try:
            await pause()
            try:
                mark = os.getxattr(dfd, OWNER_XATTR)
            except OSError:
                return None
            if mark != f"{token} {directory}".encode():
                return None
            await pause()
            try:
                return os.open(name, (flags & ~os.O_TRUNC) | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                               mode, dir_fd=dfd)
            except FileExistsError:
                if flags & os.O_EXCL:
                    raise
                return None
            except OSError:
                return None
        finally:
            fcntl.flock(dfd, fcntl.LOCK_UN)
    finally:
        os.close(dfd)
