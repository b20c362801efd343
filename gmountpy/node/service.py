"""What a node answers to its peers: operations on its own export.

Each operation acts on this node's export only -- never on another node --
so data always moves directly between the asking node and the holder.
Peers open files and get a handle; the descriptors belong to the
connection and are closed when it ends, so a crashed peer leaks nothing.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from typing import Any

from ..rpc import Session
from .export import Attr, Export

#: Largest single read or write a peer may ask for.
MAX_IO = 4 * 1024 * 1024


def _absent(exc: OSError) -> bool:
    return exc.errno in (errno.ENOENT, errno.ENOTDIR)


class _Handles:
    """Descriptors opened on behalf of one peer connection."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        self.next = 1

    def add(self, fd: int) -> int:
        handle = self.next
        self.next += 1
        self.fds[handle] = fd
        return handle

    def get(self, handle: int) -> int:
        try:
            return self.fds[handle]
        except (KeyError, TypeError):
            raise OSError(errno.EBADF, f"no open handle {handle!r}") from None

    def close_all(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    return value


class NodeService:
    """Dispatches peer requests to the export. `info` is what `ping` returns."""

    def __init__(self, export: Export, info: dict[str, Any],
                 extra: dict[str, Callable[..., Awaitable[Any]]] | None = None) -> None:
        self.export = export
        self.info = info
        self._extra = extra or {}
        self._ops: dict[str, Callable[..., Any]] = {
            name[3:]: getattr(self, name) for name in dir(self) if name.startswith("op_")
        }

    async def dispatch(self, session: Session, op: str, args: list[Any]) -> Any:
        if op in self._extra:
            return await self._extra[op](*args)
        method = self._ops.get(op)
        if method is None:
            raise OSError(errno.ENOSYS, f"unknown operation {op!r}")
        if op in ("open", "read", "write", "fsync", "fstat", "close", "ftruncate"):
            return method(self._handles(session), *args)
        return method(*args)

    @staticmethod
    def _handles(session: Session) -> _Handles:
        handles = session.data.get("handles")
        if handles is None:
            handles = session.data["handles"] = _Handles()
            session.cleanups.append(handles.close_all)
        return handles

    # -- metadata ----------------------------------------------------------

    def op_ping(self) -> dict[str, Any]:
        return {**self.info, "pid": os.getpid()}

    def op_lookup(self, path: str) -> Attr | None:
        """Attributes if this node holds `path`, None if not (a negative is not an error)."""
        try:
            return self.export.lstat(path)
        except OSError as exc:
            if _absent(exc):
                return None
            raise

    def op_listdir(self, path: str) -> list[tuple[str, Attr]] | None:
        try:
            return self.export.listdir(path)
        except OSError as exc:
            if _absent(exc):
                return None
            raise

    def op_statfs(self) -> tuple[int, ...]:
        return self.export.statfs()

    def op_readlink(self, path: str) -> str:
        return self.export.readlink(path)

    def op_mkdir(self, path: str, mode: int) -> Attr:
        return self.export.mkdir(path, _int(mode, "mode"))

    def op_unlink(self, path: str) -> None:
        self.export.unlink(path)

    def op_rmdir(self, path: str) -> None:
        self.export.rmdir(path)

    def op_rename(self, src: str, dst: str) -> None:
        self.export.rename(src, dst)

    def op_chmod(self, path: str, mode: int) -> Attr:
        return self.export.chmod(path, _int(mode, "mode"))

    def op_truncate(self, path: str, size: int) -> Attr:
        return self.export.truncate(path, _int(size, "size"))

    def op_utimens(self, path: str, atime_ns: int | None, mtime_ns: int | None) -> Attr:
        return self.export.utimens(path, atime_ns, mtime_ns)

    def op_symlink(self, target: str, path: str) -> Attr:
        return self.export.symlink(target, path)

    def op_getxattr(self, path: str, name: str) -> bytes:
        return self.export.getxattr(path, name)

    def op_setxattr(self, path: str, name: str, value: bytes) -> None:
        self.export.setxattr(path, name, value)

    def op_listxattr(self, path: str) -> list[str]:
        return self.export.listxattr(path)

    def op_removexattr(self, path: str, name: str) -> None:
        self.export.removexattr(path, name)

    # -- file data, through handles owned by the connection ----------------

    def op_open(self, handles: _Handles, path: str, flags: int) -> tuple[int, Attr]:
        fd = self.export.open(path, _int(flags, "flags"))
        try:
            attr = Attr.from_stat(os.fstat(fd))
        except OSError:
            os.close(fd)
            raise
        return handles.add(fd), attr

    def op_read(self, handles: _Handles, handle: int, offset: int, size: int) -> bytes:
        if not 0 <= _int(size, "size") <= MAX_IO:
            raise OSError(errno.EINVAL, f"read size {size} outside 0..{MAX_IO}")
        return os.pread(handles.get(handle), size, _int(offset, "offset"))

    def op_write(self, handles: _Handles, handle: int, offset: int, data: bytes) -> int:
        if not isinstance(data, bytes) or len(data) > MAX_IO:
            raise OSError(errno.EINVAL, "write data must be bytes of at most 4 MiB")
        return os.pwrite(handles.get(handle), data, _int(offset, "offset"))

    def op_fsync(self, handles: _Handles, handle: int, datasync: bool) -> None:
        fd = handles.get(handle)
        if datasync:
            os.fdatasync(fd)
        else:
            os.fsync(fd)

    def op_fstat(self, handles: _Handles, handle: int) -> Attr:
        return Attr.from_stat(os.fstat(handles.get(handle)))

    def op_ftruncate(self, handles: _Handles, handle: int, size: int) -> Attr:
        fd = handles.get(handle)
        os.ftruncate(fd, _int(size, "size"))
        return Attr.from_stat(os.fstat(fd))

    def op_close(self, handles: _Handles, handle: int) -> None:
        fd = handles.get(handle)
        del handles.fds[handle]
        os.close(fd)
