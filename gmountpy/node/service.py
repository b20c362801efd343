"""What a node answers to its peers: operations on its own export.

Each operation acts on this node's export only -- never on another node --
so data always moves directly between the asking node and the holder.
Peers open files and get a handle; the descriptors belong to the
connection and are closed when it ends, so a crashed peer leaks nothing.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import trio

from ..cluster.config import Tuning
from ..protocol import messages as msg
from ..protocol.attr import Attr
from ..protocol.codec import WireError
from ..protocol.messages import ChecksumReply, DirEntry, LocateReply, OpendirReply, OpenReply, ReplicaSource
from ..protocol.rpc import BadRequest, Session
from .export import Export, is_temporary_name, off_loop, pread, pwrite, split_path, temporary_name
from .puts import PutJournal
from .replicas import STAGED_XATTR, Replica, ReplicaTable, is_marked_copy

log = logging.getLogger(__name__)

#: Largest single read or write a peer may ask for (msg.Read and msg.Write bound it).
MAX_IO = msg.MAX_IO

#: Entries in one listdir reply; a bigger directory is read in pages (opendir/readdir),
#: because one reply must fit in a frame (about 60 bytes an entry, 16 MiB a frame).
LISTDIR_MAX = 50_000
#: Operations that take a connection's handle table as their first argument.
HANDLE_OPS = frozenset({"open", "read", "write", "fsync", "fstat", "close", "ftruncate", "opendir", "readdir",
                        "closedir", "put_open", "put_close", "put_abort", "settle"})
#: Operations kept on the event loop: answered from memory, or one syscall on one entry
#: (an lstat, a readlink) that costs ~3 us where a thread hop costs 100-200 us, and a
#: lookup is the most frequent request there is. Everything else that touches the
#: disk -- listings, opens, data, fsync, truncates, creates, removals -- runs in a
#: worker thread. (A disk that hangs outright therefore still stalls lookups.)
INLINE_OPS = frozenset({"ping", "lookup", "locate", "readlink", "getxattr", "listxattr", "statfs"})
# (op_open too, unless it truncates: an open walks a path like a lookup; a FIFO or device is
# opened non-blocking, so it never waits for a peer.)


#: Who sent the request an added operation (`add_operations`) is serving: the peer's name (this
#: node's own name for its own requests). A directory's home tells its node's requests from others'.
REQUEST_FROM: ContextVar[str | None] = ContextVar("gmount_request_from", default=None)


def _absent(exc: OSError) -> bool:
    return exc.errno in (errno.ENOENT, errno.ENOTDIR)


class _NodeUsage:
    """Handles and listing snapshots held by all connections of one node, against the tuning limits."""

    def __init__(self, node: str, tuning: Tuning) -> None:
        self.node = node
        self.tuning = tuning
        self.handles = 0
        self.listings = 0


@dataclass(frozen=True)
class _Put:
    """A put in progress: the file it makes, its temporary beside it, the directories made for it."""

    path: str
    temporary: str
    made: tuple[str, ...]


class _Handles:
    """Descriptors opened on behalf of one peer connection.

    Reads and writes run in worker threads, so a peer may close a handle (after
    its own timeout) while a call on it is still running: the descriptor is then
    closed when that call returns, never under it (its number could be reused by
    the next open, and the call would touch another file). Calls are counted by
    descriptor: `settle` gives one descriptor a new handle number.
    """

    def __init__(self, usage: _NodeUsage | None = None) -> None:
        self.fds: dict[int, int] = {}
        self.listings: dict[int, list[DirEntry]] = {}  # directory snapshots being paged through
        self.puts: dict[int, _Put] = {}  # put handle -> what it writes
        self.next = 1
        self.usage = usage or _NodeUsage("this node", Tuning())
        self._busy: dict[int, int] = {}          # fd -> calls running on it
        self._closing: set[int] = set()          # fds to close when their last call returns
        self._idle: dict[int, trio.Event] = {}   # fd -> set when its last call returns (a settle waits)

    @contextmanager
    def using(self, handle: int) -> Iterator[int]:
        fd = self.get(handle)  # and counted at once, with no checkpoint between: a settle sees it
        self._busy[fd] = self._busy.get(fd, 0) + 1
        try:
            yield fd
        finally:
            left = self._busy[fd] - 1
            if left:
                self._busy[fd] = left
            else:
                del self._busy[fd]
                idle = self._idle.pop(fd, None)
                if idle is not None:
                    idle.set()
                if fd in self._closing:
                    self._closing.discard(fd)
                    os.close(fd)

    def close(self, handle: int) -> None:
        fd = self.remove(handle)
        if fd in self._busy:
            self._closing.add(fd)
        else:
            os.close(fd)

    async def settle(self, handle: int) -> int:
        """Retire `handle`: its open file gets a new number, returned once every call begun on the old one
        has returned. A call on the old number that has not begun yet is refused (EBADF, see `get`), so
        when this returns, whatever the peer sent on that number has been carried out or never will be."""
        fd = self.get(handle)
        del self.fds[handle]
        renewed = self.next
        self.next += 1
        self.fds[renewed] = fd
        while fd in self._busy:
            await self._idle.setdefault(fd, trio.Event()).wait()
        return renewed

    def calls_running(self, fd: int) -> int:
        """Calls on descriptor `fd` running now (in a worker thread, or waiting for one)."""
        return self._busy.get(fd, 0)

    def check_room_for_file(self) -> None:
        """EMFILE naming the limit, before anything is opened."""
        usage, tuning = self.usage, self.usage.tuning
        if len(self.fds) >= tuning.handles_per_connection:
            raise OSError(errno.EMFILE, f"too many open files on node {usage.node} for one connection: "
                                        f"{len(self.fds)}, the limit of tuning.handles_per_connection; "
                                        "close some or raise the limit")
        if usage.handles >= tuning.handles_per_node:
            raise OSError(errno.EMFILE, f"too many open files on node {usage.node}: {usage.handles} over all "
                                        "connections, the limit of tuning.handles_per_node; "
                                        "close some or raise the limit")

    def check_room_for_listing(self) -> None:
        usage, tuning = self.usage, self.usage.tuning
        if len(self.listings) >= tuning.listings_per_connection:
            raise OSError(errno.EMFILE, f"too many open directory listings on node {usage.node} for one "
                                        f"connection: {len(self.listings)}, the limit of "
                                        "tuning.listings_per_connection; close some (closedir) or raise the limit")
        if usage.listings >= tuning.listings_per_node:
            raise OSError(errno.EMFILE, f"too many open directory listings on node {usage.node}: {usage.listings} "
                                        "over all connections, the limit of tuning.listings_per_node; "
                                        "close some (closedir) or raise the limit")

    def add(self, fd: int) -> int:
        handle = self.next
        self.next += 1
        self.fds[handle] = fd
        self.usage.handles += 1
        return handle

    def remove(self, handle: int) -> int:
        fd = self.get(handle)
        del self.fds[handle]
        self.usage.handles -= 1
        return fd

    def get(self, handle: int) -> int:
        try:
            return self.fds[handle]
        except KeyError:
            raise OSError(errno.EBADF, f"no open handle {handle!r}") from None

    def add_listing(self, entries: list[DirEntry]) -> int:
        handle = self.next
        self.next += 1
        self.listings[handle] = entries
        self.usage.listings += 1
        return handle

    def drop_listing(self, handle: int) -> None:
        if self.listings.pop(handle, None) is not None:
            self.usage.listings -= 1

    def listing(self, handle: int) -> list[DirEntry]:
        try:
            return self.listings[handle]
        except KeyError:
            raise OSError(errno.EBADF, f"no open directory handle {handle!r}") from None

    def close_all(self) -> None:
        for handle in list(self.fds):
            self.close(handle)
        self.usage.listings -= len(self.listings)
        self.listings.clear()


class IOCounters:
    """Bytes this node moved, by where they came from: the locality a workflow achieved.

    `read_local`/`read_remote`: bytes this node's mount handed to its programs
    from this node's export / from other nodes; `write_local`/`write_remote`
    likewise for writes. `served_read`/`served_write`: bytes peers read from
    or wrote to this node's export. Reads the kernel answers from its page
    cache never reach the daemon and are not counted. `requests_served`:
    requests this node answered, from peers and clients (`gmount top`'s rate).
    """

    FIELDS = ("read_local", "read_remote", "write_local", "write_remote", "served_read", "served_write",
              "requests_served")

    def __init__(self) -> None:
        self.read_local = self.read_remote = self.write_local = self.write_remote = 0
        self.served_read = self.served_write = self.requests_served = 0
        #: requests this node sent to other nodes, by operation (PeerPool counts them): in the
        #: snapshot as `messages_sent` and `messages.<op>`, so tests and benchmarks count messages/op
        self.messages: Counter[str] = Counter()

    def mount_read(self, local: bool, size: int) -> None:
        if local:
            self.read_local += size
        else:
            self.read_remote += size

    def mount_write(self, local: bool, size: int) -> None:
        if local:
            self.write_local += size
        else:
            self.write_remote += size

    def snapshot(self) -> dict[str, int]:
        counts = {name: getattr(self, name) for name in self.FIELDS}
        counts["messages_sent"] = sum(self.messages.values())
        counts.update({f"messages.{op}": n for op, n in sorted(self.messages.items())})
        return counts


def _settable_xattr(name: str) -> str:
    """Only `user.*` attributes may be set or removed on a peer's request.

    trusted.* and security.* (file capabilities, SELinux labels) need privileges on the
    holder: a daemon running as root would set them for any peer, and for any user of an
    allow_other mount. system.posix_acl_* would not be enforced through the mount (the
    kernel checks mode bits there), so ACLs are refused as by a file system without them.
    """
    if not name.startswith("user."):
        raise OSError(errno.EOPNOTSUPP, f"extended attribute {name!r}: only user.* attributes can be set or removed "
                                        "through gmount (see docs/posix.md)")
    return name


class NodeService:
    """Serves peer requests from the export. `info` is what `ping` returns.

    Each `op_*` method serves the request type its last parameter names; `extra` (and
    `add_operations`) are more handler tables (msg.operations), answered before these.
    """

    def __init__(self, export: Export, info: dict[str, Any], extra: msg.Operations | None = None,
                 replicas: ReplicaTable | None = None, *, tuning: Tuning | None = None,
                 puts: PutJournal | None = None) -> None:
        self.export = export
        self.usage = _NodeUsage(str(info.get("node", "this node")), tuning or Tuning())
        self.replicas = replicas if replicas is not None else ReplicaTable()
        self.puts = puts if puts is not None else PutJournal()
        self._remove_leftover_temporaries()
        self.info = info
        self.counters = IOCounters()
        self._extra: msg.Operations = extra if extra is not None else {}
        #: Told of every file a put finished, so this node's own lookups see it at once (the daemon
        #: points it at its locator).
        self.on_created: Callable[[str, Attr], Awaitable[None]] | None = None
        self._ops = msg.operations(*(getattr(self, name) for name in dir(type(self)) if name.startswith("op_")))

    def add_operations(self, operations: msg.Operations) -> None:
        """Serve more operations, answered before the export's own: the node-wide ones the daemon wires in
        (node.control, the directory index)."""
        self._extra.update(operations)

    async def dispatch(self, session: Session, op: str, args: list[Any]) -> Any:
        """A peer's request, as it came: decoded through its message type before any handler runs
        (arguments that do not fit are refused with EINVAL naming the operation and the field),
        served, and its reply encoded through the reply's type."""
        self.counters.requests_served += 1
        kind = msg.REQUESTS.get(op) or next((kind for kind in self._extra if kind.op == op), None)
        if kind is None:
            raise OSError(errno.ENOSYS, f"unknown operation {op!r}")
        try:
            request = kind.from_wire(args)
        except WireError as exc:
            raise BadRequest(f"bad arguments to {op!r} on node {self.usage.node}: {exc}") from None
        return request.encode_reply(await self.serve(session, request))

    async def serve(self, session: Session, request: msg.Request[msg.R]) -> msg.R:
        """A typed request served by its handler: its typed reply. (A node's requests to itself come
        here directly, without a wire form: PeerPool.ask.)"""
        kind = type(request)
        handler = self._extra.get(kind)
        if handler is not None:
            sender = REQUEST_FROM.set(session.peer)
            try:
                return await handler(request)  # type: ignore[no-any-return]
            finally:
                REQUEST_FROM.reset(sender)
        method = self._ops.get(kind)
        if method is None:
            raise OSError(errno.ENOSYS, f"node {self.usage.node} does not serve {request.op!r}")
        if kind.op in HANDLE_OPS:
            result = method(self._handles(session), request)
        elif kind.op in INLINE_OPS or inspect.iscoroutinefunction(method):
            result = method(request)
        else:
            # Every other operation touches the export's disk: a worker thread keeps a slow
            # disk or a stuck call from stalling the requests of every other caller.
            return await off_loop(method, request)
        if inspect.iscoroutine(result):
            return await result  # type: ignore[no-any-return]
        return result  # type: ignore[no-any-return]

    def _remove_leftover_temporaries(self) -> None:
        """Stagings and puts interrupted by a crash left their temporary files: never show them as files."""
        stagings, puts = self.replicas.leftover_temporaries(), self.puts.leftovers()
        for temporary, what in [*((t, "staging") for t in stagings), *((t, "put") for t in puts)]:
            try:
                self.export.unlink(temporary)
                log.info("removed %s, left over from an interrupted %s", temporary, what)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove %s, left over from an interrupted %s: %s", temporary, what, exc)
        self.replicas.end_staging(stagings)
        self.puts.forget(puts)

    def _handles(self, session: Session) -> _Handles:
        handles = session.data.get("handles")
        if handles is None:
            handles = session.data["handles"] = _Handles(self.usage)
            session.cleanups.append(handles.close_all)  # cleanups run last first: the puts' files go, then fds
            session.cleanups.append(lambda: self._drop_puts(handles))
        return handles

    # -- metadata ----------------------------------------------------------

    def op_ping(self, request: msg.Ping) -> msg.PingReply:
        return cast(msg.PingReply, {**self.info, "pid": os.getpid(), "counters": self.counters.snapshot()})

    def op_counters(self, request: msg.Counters) -> dict[str, int]:
        """This node's byte counters (see IOCounters)."""
        return self.counters.snapshot()

    def op_rescan(self, request: msg.Rescan) -> int:
        """Without a directory index nothing needs telling (the index's ExportWatcher serves it)."""
        return 0

    def op_lookup(self, request: msg.Lookup) -> Attr | None:
        return self.lookup(request.path)

    def lookup(self, path: str) -> Attr | None:
        """Attributes if this node holds `path`, None if not (a negative is not an error)."""
        if (self.replicas.is_staging_temporary(path) or path in self.puts
                or is_temporary_name(path.rpartition("/")[2])):
            return None  # a put's or a staging's copy in progress is nobody's file yet
        try:
            attr = self.export.lstat(path)
        except OSError as exc:
            if _absent(exc):
                return None
            raise
        if self.replicas.damaged is not None and self._marked_copy(path, attr):
            return None
        return attr

    def _marked_copy(self, path: str, attr: Attr) -> bool:
        """With a damaged replica table: is this file a staged copy (by its mark)? Then hide it."""
        if not attr.is_file:
            return False
        try:
            return is_marked_copy(self.export.getxattr(path, STAGED_XATTR), attr)
        except OSError:
            return False

    def op_locate(self, request: msg.Locate) -> LocateReply | None:
        """Like lookup, plus the source, its size and mtime when this node's copy is a staged replica."""
        attr = self.lookup(request.path)
        if attr is None:
            return None
        replica = self.replica(request.path, attr)
        return LocateReply(attr, None if replica is None else
                           ReplicaSource(replica.source, replica.source_size, replica.source_mtime_ns))

    def replica(self, path: str, attr: Attr) -> Replica | None:
        """The replica record of `path` if the file here is still exactly the staged copy."""
        replica = self.replicas.get(path)
        if replica is not None and not replica.matches_local(attr):
            self.replicas.forget(path)  # changed in place: now an ordinary file of this node
            return None
        return replica

    def op_drop_replica(self, request: msg.DropReplica) -> bool:
        """Remove a stale replica (its source changed); never removes an ordinary file."""
        path = request.path
        attr = self.lookup(path)
        replica = self.replicas.get(path)
        if attr is None or replica is None or not replica.matches_local(attr):
            return False
        if (replica.source_size, replica.source_mtime_ns) != (request.source_size, request.source_mtime_ns):
            return False  # restaged meanwhile
        self.export.unlink(path)
        self.replicas.forget(path)
        return True

    async def op_checksum(self, request: msg.Checksum) -> ChecksumReply:
        """(size, sha256) of a file here, hashed in a worker thread so the node keeps serving."""
        def digest() -> ChecksumReply:
            fd = self.export.open(request.path, os.O_RDONLY)
            try:
                h = hashlib.sha256()
                size = 0
                while chunk := os.read(fd, 1 << 20):
                    h.update(chunk)
                    size += len(chunk)
                return ChecksumReply(size, h.hexdigest())
            finally:
                os.close(fd)

        return await off_loop(digest)

    def op_listdir(self, request: msg.Listdir) -> list[DirEntry] | None:
        """Entries with attributes; a staged replica's entry carries its source node.

        EFBIG for a directory of more than LISTDIR_MAX entries: read it with opendir/readdir.
        """
        entries = self.listing(request.path)
        if entries is not None and len(entries) > LISTDIR_MAX:
            raise OSError(errno.EFBIG, f"{request.path} has {len(entries)} entries: list it in pages (opendir)")
        return entries

    async def op_opendir(self, handles: _Handles, request: msg.Opendir) -> OpendirReply | None:
        """Snapshot a directory's listing for paging: (handle, number of entries), None if absent."""
        handles.check_room_for_listing()
        entries = await off_loop(self.listing, request.path)
        if entries is None:
            return None
        return OpendirReply(handles.add_listing(entries), len(entries))

    def op_readdir(self, handles: _Handles, request: msg.Readdir) -> list[DirEntry]:
        listing = handles.listing(request.handle)
        return listing[request.start:request.start + min(request.count, LISTDIR_MAX)]

    def op_closedir(self, handles: _Handles, request: msg.Closedir) -> None:
        handles.drop_listing(request.handle)

    def listing(self, path: str) -> list[DirEntry] | None:
        """This node's entries of directory `path` (None: no such directory here), staged replicas
        with their source node, staging copies and puts' temporaries left out."""
        try:
            entries = self.export.listdir(path)
        except OSError as exc:
            if _absent(exc):
                return None
            raise
        if any(".gmount-" in name for name, _ in entries):  # puts and stagings under way: nobody's files
            entries = [(name, attr) for name, attr in entries if not is_temporary_name(name)]
        prefix = path.rstrip("/") + "/"
        if self.replicas.damaged is not None:
            return [DirEntry(name, attr) for name, attr in entries if not self._marked_copy(prefix + name, attr)]
        if not len(self.replicas) and not self.replicas.leftover_temporaries() and not len(self.puts):
            return [DirEntry(name, attr) for name, attr in entries]
        result: list[DirEntry] = []
        for name, attr in entries:
            if self.replicas.is_staging_temporary(prefix + name) or prefix + name in self.puts:
                continue
            replica = self.replica(prefix + name, attr) if self.replicas.get(prefix + name) else None
            result.append(DirEntry(name, attr, None if replica is None else replica.source))
        return result

    def op_statfs(self, request: msg.Statfs) -> tuple[int, ...]:
        return self.export.statfs()

    def op_readlink(self, request: msg.Readlink) -> str:
        return self.export.readlink(request.path)

    def op_mkdir(self, request: msg.Mkdir) -> Attr:
        return self.export.mkdir(request.path, request.mode)

    def op_unlink(self, request: msg.Unlink) -> None:
        self.unlink(request.path)

    def unlink(self, path: str) -> None:
        self.export.unlink(path)
        self.replicas.forget(path)

    def op_rmdir(self, request: msg.Rmdir) -> None:
        self.export.rmdir(request.path)

    def op_rename(self, request: msg.Rename) -> None:
        self.export.rename(request.src, request.dst)
        self.replicas.renamed(request.src, request.dst)

    def op_chmod(self, request: msg.Chmod) -> Attr:
        return self.export.chmod(request.path, request.mode)

    def op_truncate(self, request: msg.Truncate) -> Attr:
        return self.export.truncate(request.path, request.size)

    def op_utimens(self, request: msg.Utimens) -> Attr:
        return self.export.utimens(request.path, request.atime_ns, request.mtime_ns)

    def op_symlink(self, request: msg.Symlink) -> Attr:
        return self.export.symlink(request.target, request.path)

    def op_mknod(self, request: msg.Mknod) -> Attr:
        return self.export.mknod(request.path, request.mode, request.rdev)

    def op_link(self, request: msg.Link) -> Attr:
        return self.export.link(request.src, request.dst)

    def op_chown(self, request: msg.Chown) -> Attr:
        return self.export.chown(request.path, request.uid, request.gid)

    def op_getxattr(self, request: msg.Getxattr) -> bytes:
        return self.export.getxattr(request.path, request.name)

    def op_setxattr(self, request: msg.Setxattr) -> None:
        self.export.setxattr(request.path, _settable_xattr(request.name), request.value)

    def op_listxattr(self, request: msg.Listxattr) -> list[str]:
        return self.export.listxattr(request.path)

    def op_removexattr(self, request: msg.Removexattr) -> None:
        self.export.removexattr(request.path, _settable_xattr(request.name))

    # -- file data, through handles owned by the connection ----------------

    async def op_open(self, handles: _Handles, request: msg.Open) -> OpenReply:
        handles.check_room_for_file()

        def open_and_stat() -> tuple[int, Attr]:
            fd = self.export.open(request.path, request.flags)
            try:
                return fd, self.export.attr(os.fstat(fd))
            except OSError:
                os.close(fd)
                raise

        # Like a lookup, an open stays on the event loop unless it truncates (see INLINE_OPS).
        fd, attr = await off_loop(open_and_stat) if request.flags & os.O_TRUNC else open_and_stat()
        return OpenReply(handles.add(fd), attr)

    async def op_read(self, handles: _Handles, request: msg.Read) -> bytes:
        with handles.using(request.handle) as fd:
            data = await pread(fd, request.size, request.offset)
        self.counters.served_read += len(data)
        return data

    async def op_write(self, handles: _Handles, request: msg.Write) -> int:
        with handles.using(request.handle) as fd:
            written = await pwrite(fd, request.data, request.offset)
        self.counters.served_write += written
        return written

    async def op_fsync(self, handles: _Handles, request: msg.Fsync) -> None:
        with handles.using(request.handle) as fd:
            await off_loop(os.fdatasync if request.datasync else os.fsync, fd)

    def op_fstat(self, handles: _Handles, request: msg.Fstat) -> Attr:
        return self.export.attr(os.fstat(handles.get(request.handle)))  # the inode is in memory: never waits

    async def op_ftruncate(self, handles: _Handles, request: msg.Ftruncate) -> Attr:
        with handles.using(request.handle) as fd:
            def truncate() -> Attr:
                os.ftruncate(fd, request.size)
                return self.export.attr(os.fstat(fd))
            return await off_loop(truncate)

    def op_close(self, handles: _Handles, request: msg.Close) -> None:
        handles.close(request.handle)

    async def op_settle(self, handles: _Handles, request: msg.Settle) -> int:
        """After a write whose reply the peer did not get: let it land or never land, then answer."""
        if request.handle in handles.puts:
            raise OSError(errno.EINVAL, f"handle {request.handle} is a put's: put_close or put_abort ends it")
        started = trio.current_time()
        renewed = await handles.settle(request.handle)
        if trio.current_time() - started > 1.0:
            log.info("node %s settled a handle after %.1f s of calls still running on it", self.usage.node,
                     trio.current_time() - started)
        return renewed

    # -- whole files written from outside the mount (library API, fsspec, Snakemake storage) ----
    #
    # put_open makes a hidden temporary file beside the destination (parents made
    # here), the data comes with `write` on that handle, and put_close checks size
    # and SHA-256 of what landed on disk before renaming it into place, so a
    # reader never sees a half-written file and a failed put leaves nothing. Every
    # disk call runs in a worker thread; a finished put is durable (the file, its
    # directory and any directory made for it are fsynced) before put_close answers.
    # A descriptor is closed only once no call on it is running: a write still
    # waiting for a disk thread when the put is given up must not land in whatever
    # file is opened next under the same descriptor number.

    async def op_put_open(self, handles: _Handles, request: msg.PutOpen) -> int:
        """Start writing `path` into this export; the handle takes `write` calls."""
        path = request.path
        if not split_path(path):
            raise OSError(errno.EISDIR, "/ is the export root, not a file")
        temporary = temporary_name(path, "put")
        handles.check_room_for_file()
        made: list[str] = []
        await off_loop(self.puts.begin, temporary)  # before the file: a crash in between leaves it nothing to find
        try:
            fd = await off_loop(self.export.create, temporary, os.O_RDWR | os.O_EXCL, request.mode & 0o7777, True,
                                made)
        except BaseException:
            self.puts.end(temporary)
            raise
        handle = handles.add(fd)
        handles.puts[handle] = _Put(path, temporary, tuple(made))
        return handle

    async def op_put_close(self, handles: _Handles, request: msg.PutClose) -> Attr:
        """Finish a put: verify what is on disk against (size, sha256), then rename it into place."""
        handle, size, sha256 = request.handle, request.size, request.sha256
        put = self._put(handles, handle)
        del handles.puts[handle]
        try:
            with handles.using(handle) as fd:
                handles.close(handle)  # no call may start on it now; closed when the last one returns
                if handles.calls_running(fd) > 1:
                    raise OSError(errno.EBUSY, f"{put.path}: writes to it are still running on node "
                                               f"{self.usage.node}; write it again")
                written, digest = await off_loop(sync_and_hash, fd)
        except BaseException:
            with trio.CancelScope(shield=True):
                await off_loop(self._remove_temporary, put.temporary)
            raise
        if (written, digest) != (size, sha256):
            await off_loop(self._remove_temporary, put.temporary)
            raise OSError(errno.EIO, f"{put.path}: {written} bytes with sha256 {digest[:16]}... landed on disk, "
                                     f"expected {size} bytes with sha256 {sha256[:16]}...; write it again")
        attr = await off_loop(self._finish_put, put)
        if self.on_created is not None:
            await self.on_created(put.path, attr)
        return attr

    def _finish_put(self, put: _Put) -> Attr:
        """Rename the verified temporary into place, durably (worker thread)."""
        try:
            self.export.rename(put.temporary, put.path)
        except BaseException:
            self._remove_temporary(put.temporary)
            raise
        self.puts.end(put.temporary)
        self.replicas.forget(put.path)  # a replica overwritten here is now this node's own file
        self.export.sync_parents(put.path, list(put.made))
        return self.export.lstat(put.path)

    async def op_put_abort(self, handles: _Handles, request: msg.PutAbort) -> None:
        """Give up a put: its temporary file goes away, the destination is untouched."""
        put = self._put(handles, request.handle)
        del handles.puts[request.handle]
        handles.close(request.handle)  # at once, or when the last write running on it returns
        await off_loop(self._remove_temporary, put.temporary)

    @staticmethod
    def _put(handles: _Handles, handle: int) -> _Put:
        try:
            return handles.puts[handle]
        except KeyError:
            raise OSError(errno.EBADF, f"no put in progress on handle {handle}") from None

    def _drop_puts(self, handles: _Handles) -> None:
        """The connection ended mid-put: remove the temporary files (close_all closes their fds)."""
        for put in handles.puts.values():
            self._remove_temporary(put.temporary)

    def _remove_temporary(self, temporary: str) -> None:
        """A put is over without its file: its temporary goes (if it can: a note left means the next start
        tries again)."""
        try:
            self.export.unlink(temporary)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove %s, the temporary file of a put given up: %s", temporary, exc)
            return
        self.puts.end(temporary)


def sync_and_hash(fd: int) -> tuple[int, str]:
    """fsync, then (size, sha256) of what is on disk: the check before a verified rename into place."""
    os.fsync(fd)
    digest = hashlib.sha256()
    size = 0
    while block := os.pread(fd, 1 << 20, size):
        digest.update(block)
        size += len(block)
    return size, digest.hexdigest()
