"""The local bypass: this node's daemon tells jobs which files they may use straight from the export.

Jobs started by gmount load `libgmount_preload.so` (gmountpy/jobs/bypass.py, csrc/gmount_preload.c).
For a path inside this node's mount whose file this node holds itself, the job opens (or stats)
the file in the export, and its reads and writes never pass through FUSE (docs/bypass.md).

The daemon's word. The mount root's xattr `user.gmount.bypass` names a Unix socket. The hello
on it (`H`) gives the export root, a lease (LEASE) and the two marks of export files that are not
this node's own: the xattr of a staged replica and the name of a staging copy. While the lease
runs, a job takes a regular file at the path in the export, reached without a symlink and
unmarked, as this node's own -- which is what this node's lookup answers first (`op_locate` of
its export, then the other nodes) -- and stats or reads it without asking. A marked file is asked
about (`R`): a replica is used only after the lookup that checks its source is unchanged, as an
open through the mount would. Writing asks too (`W`): a replica's writes go to its source.

The hello also gives what makes the job's stats the mount's: this node's slot and its
export's device, so a stat of an export file shows the mount's st_dev and st_ino (`file_ino`
of gmountpy/node/inodes.py, the file's identity on every node). Files of another file
system mounted inside the export (numbered by a hash) are served by the mount. And it gives
the owner mark of directories this node owns (gmountpy/node/index/owners.py) with this
daemon's token and user, under which a job of that user creates new files straight in the
export: nobody else holds a lease in such a directory, and the first request of another node
about it lists the export into the index before it is answered.

What the mount would have told the other nodes is still told:

- other creates and truncations go through the mount before the library swaps the descriptor;
- a descriptor opened for writing through the bypass reports its close (`C`): the file's
  attributes then reach the directory's home before close() returns (close-to-open);
- such files are also watched with inotify (IN_CLOSE_WRITE), which covers descriptors
  closed by exit or by a program that inherited them across exec.

Bytes jobs move through the bypass are reported when they close the descriptor and join the
node's counters (`read_local`, `write_local`), so locality reports still add up; bytes moved
through a descriptor inherited across exec, or through mmap, are not seen.

Wire format (little-endian): request `u32 len | u8 op | 3 x u8 0 | path`, reply
`u32 len | i32 status | payload`; ops `H`ello, `R`ead, `W`rite, `C`losed after writing and
`D`one reading (their path is followed by NUL and the bytes read and written); status 0 =
served here (payload: the export path; for `H` export root, staged xattr, staging mark,
lease in ms, this node's slot, the export's st_dev, owner xattr, owner token (empty: none),
uid and gid of the daemon, NUL-separated), 1 = use the mount.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import socket
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from ..errors import PeerUnavailable
from ..protocol import messages as msg
from .export import split_path
from .index.marks import OWNER_XATTR, Owners
from .inodes import holder_slots
from .locator import Location
from .namespace import Namespace
from .replicas import STAGED_XATTR, STAGING_MARKER
from .service import NodeService

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The mount root's xattr naming the channel: PROTOCOL followed by the socket's path.
XATTR = "user.gmount.bypass"
PROTOCOL = "gmount-bypass 2 "
SERVED, USE_MOUNT = 0, 1
_HEADER = struct.Struct("<IB3x")
_REPLY = struct.Struct("<Ii")
MAX_REQUEST = 8 + 4096 + 64  # a path, and for a close the bytes moved
#: How long a job may take the hello's answer as this daemon's word before asking again: a daemon
#: that stops serving the bypass (or dies) has its jobs back on the mount within this time.
LEASE = 1.0
#: Files written through the bypass that stay watched (the oldest watch goes first).
MAX_WATCHES = 4096
#: Attributes last announced per path, so an inotify event after a close notice costs nothing.
MAX_REMEMBERED = 8192
#: Job connections served at once (a thread each); beyond, jobs use the mount.
MAX_CONNECTIONS = 256

_IN_CLOSE_WRITE = 0x00000008
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_DONT_FOLLOW = 0x02000000
_IN_EVENT = struct.Struct("iIII")


def socket_directory() -> str:
    """A directory only this user can enter: $XDG_RUNTIME_DIR/gmountpy, else /tmp/gmountpy-UID."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    candidates = [os.path.join(runtime, "gmountpy")] if runtime and os.path.isdir(runtime) else []
    candidates.append(f"/tmp/gmountpy-{os.geteuid()}")
    problems = []
    for directory in candidates:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            problems.append(f"{directory}: {exc.strerror}")
            continue
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            problems.append(f"{directory} is not a directory of this user with mode 0700")
            continue
        return directory
    raise OSError(errno.EACCES, "no private directory for the bypass socket: " + "; ".join(problems))


def socket_path(cluster: str, node: str) -> str:
    """Where this daemon listens (sun_path holds 107 bytes: long names fall back to the pid). The
    sockets an earlier daemon of this node left behind (killed) are removed."""
    directory = socket_directory()
    prefix = f"{cluster}-{node}-"
    for name in os.listdir(directory):
        pid = name[len(prefix):-len(".sock")]
        if name.startswith(prefix) and name.endswith(".sock") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
    path = os.path.join(directory, f"{prefix}{os.getpid()}.sock")
    if len(os.fsencode(path)) > 107:
        path = os.path.join(directory, f"{os.getpid()}.sock")
    return path


def _receive(conn: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes, or None at the end of the connection."""
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class _Inotify:
    """IN_CLOSE_WRITE watches on files written through the bypass (ctypes: the stdlib has none)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")

    def add(self, path: str) -> int:
        wd = self._add(self.fd, os.fsencode(path), _IN_CLOSE_WRITE | _IN_DONT_FOLLOW)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        return int(wd)

    def remove(self, wd: int) -> None:
        self._rm(self.fd, wd)

    def read(self) -> list[tuple[int, int]]:
        """(wd, mask) of the events queued now."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        events = []
        offset = 0
        while offset + _IN_EVENT.size <= len(data):
            wd, mask, _cookie, length = _IN_EVENT.unpack_from(data, offset)
            events.append((wd, mask))
            offset += _IN_EVENT.size + length
        return events

    def close(self) -> None:
        os.close(self.fd)


class BypassServer:
    """Answers the preload library of jobs on this node (see the module docstring).

    Requests are answered in threads, one per connection (a job holds at most a few), so a
    stat through the bypass costs one socket round trip and the export's own lookup
    (`NodeService.op_locate`, what this node's locator asks first) -- not a turn of the event
    loop. What needs the event loop (a replica checked at its source, announcing a close) is
    handed to it.
    """

    def __init__(self, namespace: Namespace, service: NodeService, path: str, *, any_user: bool = False,
                 on_changed: Callable[[str], Awaitable[None]] | None = None, owners: Owners | None = None) -> None:
        self.ns = namespace
        #: the marks of directories this node owns: jobs create there straight in the export
        self.owners = owners
        self._slot = holder_slots(namespace.site_of)[namespace.me]
        self.service = service
        self.path = path
        self.any_user = any_user  # allow_other: other users' jobs may ask too (the kernel checks their opens)
        #: called after a file written through the bypass changed (the FUSE layer drops the kernel's attributes)
        self.on_changed = on_changed
        self.served = {"R": 0, "W": 0, "C": 0, "mount": 0, "bytes_read": 0, "bytes_written": 0}
        self._inotify: _Inotify | None = None
        self._lock = threading.Lock()  # the watches, shared by the connection threads and the event loop
        self._watches: OrderedDict[int, tuple[str, int]] = OrderedDict()  # wd -> (namespace path, inode)
        self._announced: OrderedDict[str, tuple[int, int, int]] = OrderedDict()
        self._changing: dict[str, bool] = {}  # path -> changed again while being announced
        self._connections: set[socket.socket] = set()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def xattr_value(self) -> bytes:
        return (PROTOCOL + self.path).encode()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; the socket file is removed on the way out."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            listener.bind(self.path)
            os.chmod(self.path, 0o666 if self.any_user else 0o600)
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        try:
            self._inotify = _Inotify()
        except OSError as exc:
            log.warning("no inotify (%s): files a bypassed job writes are announced only when it closes them "
                        "itself, not when it exits or hands them to another program", exc)
        self._token = trio.lowlevel.current_trio_token()
        accepting = threading.Thread(target=self._accept, args=(listener,), name="gmount-bypass", daemon=True)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._inotify is not None:
                    nursery.start_soon(self._watch_closes)
                accepting.start()
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for sock in [listener, *self._connections]:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on them
                except OSError:
                    pass
            listener.close()
            if self._inotify is not None:
                self._inotify.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    # -- the connection threads --------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # shut down
            if not self._allowed(conn) or len(self._connections) >= MAX_CONNECTIONS:
                conn.close()  # the job's library falls back to the mount
                continue
            self._connections.add(conn)
            threading.Thread(target=self._connection, args=(conn,), name="gmount-bypass-job", daemon=True).start()

    def _allowed(self, conn: socket.socket) -> bool:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return self.any_user or uid in (os.geteuid(), 0)

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                while True:
                    header = _receive(conn, _HEADER.size)
                    if header is None:
                        return
                    length, op = _HEADER.unpack(header)
                    if length + 4 > MAX_REQUEST or length < 4:
                        return  # not our library: drop the connection
                    raw = _receive(conn, length - 4)
                    if raw is None:
                        return
                    status, payload = self.answer(chr(op), raw.decode("utf-8", "surrogateescape"))
                    data = os.fsencode(payload)
                    conn.sendall(_REPLY.pack(4 + len(data), status) + data)
        except OSError:
            pass  # the job went away
        except Exception:
            log.exception("bypass connection failed; the job falls back to the mount")
        finally:
            self._connections.discard(conn)

    def answer(self, op: str, path: str) -> tuple[int, str]:
        """(status, payload) for one request, in a connection thread; anything unexpected sends the
        job to the mount."""
        try:
            if op == "H":
                return SERVED, self._hello()
            if op in ("C", "D"):
                self._closed(op, path)
                return SERVED, ""
            split_path(path)
            if op not in ("R", "W"):
                return USE_MOUNT, ""
            located = self.service.op_locate(msg.Locate(path))  # this node's export, as its locator asks first
            if located is None or not located.attr.is_file:
                return self._mount()  # another node's (or nobody's), or not a file
            # A staged replica: writes go to its source; reads only after the lookup that checks the
            # source is unchanged (as an open through the mount would)
            if located.replica is not None and (op == "W" or not self._on_loop(self._valid_replica, path)):
                return self._mount()
            export_path = os.path.join(self.ns.export.root, *split_path(path))
            if op == "W":
                self._watch(path, export_path)
            self.served[op] += 1
            return SERVED, export_path
        except (OSError, PeerUnavailable, ValueError, trio.RunFinishedError) as exc:
            log.debug("bypass %s %s: the mount serves it (%s)", op, path, exc)
            return self._mount()

    def _hello(self) -> str:
        token = self.owners.token if self.owners is not None and self.owners.usable else ""
        return "\0".join((self.ns.export.root, STAGED_XATTR, STAGING_MARKER, str(round(LEASE * 1000)),
                           str(self._slot), str(self.ns.export.dev), OWNER_XATTR, token,
                           str(os.geteuid()), str(os.getegid())))

    def _closed(self, op: str, request: str) -> None:
        """A job closed a descriptor the bypass opened: `path NUL read written` (path empty for a
        read, or a written file unlinked meanwhile). The bytes join the node's counters, as if
        the mount had moved them; a written file is announced."""
        path, _, moved = request.partition("\0")
        read, written = (int(n) for n in moved.split())
        self.service.counters.mount_read(True, read)
        self.service.counters.mount_write(True, written)
        self.served["bytes_read"] += read
        self.served["bytes_written"] += written
        if op == "C":
            self.served["C"] += 1
            if path:
                split_path(path)
                self._on_loop(self.changed_here, path)

    def _mount(self) -> tuple[int, str]:
        self.served["mount"] += 1
        return USE_MOUNT, ""

    def _on_loop(self, func: Callable[[str], Awaitable[T]], path: str) -> T:
        if self._token is None:
            raise trio.RunFinishedError("the daemon is stopping")
        return trio.from_thread.run(func, path, trio_token=self._token)

    async def _valid_replica(self, path: str) -> bool:
        location = await self.ns.lookup(path)
        return location.node == self.ns.me and location.attr.is_file and await self.ns.locator.confirm_replica(path)

    # -- changes made through the bypass -----------------------------------------------------

    async def changed_here(self, path: str) -> None:
        """A file of this export was written through the bypass: what a close through the mount
        announces (namespace.release) is announced now. Serialised per path, newest last."""
        if path in self._changing:
            self._changing[path] = True  # the running announcement goes round once more
            return
        self._changing[path] = False
        try:
            while True:
                await self._announce(path)
                if not self._changing[path]:
                    return
                self._changing[path] = False
        finally:
            del self._changing[path]

    async def _announce(self, path: str) -> None:
        try:
            attr = self.ns.export.lstat(path)
        except OSError:
            return  # removed or renamed meanwhile: nothing to tell under this name
        if not attr.is_file:
            return
        version = (attr.size, attr.mtime_ns, attr.ctime_ns)
        if self._announced.get(path) == version:
            return
        self.ns.locator.invalidate(path)
        await self.ns.locator.announce_changed(path, Location(self.ns.me, attr))
        self._announced[path] = version
        self._announced.move_to_end(path)
        while len(self._announced) > MAX_REMEMBERED:
            self._announced.popitem(last=False)
        if self.on_changed is not None:
            await self.on_changed(path)

    def _watch(self, path: str, export_path: str) -> None:
        if self._inotify is None:
            return
        try:
            wd = self._inotify.add(export_path)
            ino = os.lstat(export_path).st_ino
        except OSError as exc:
            log.info("not watching %s for closes: %s", path, exc)
            return
        with self._lock:
            self._watches[wd] = (path, ino)
            self._watches.move_to_end(wd)
            while len(self._watches) > MAX_WATCHES:
                old, _ = self._watches.popitem(last=False)
                self._inotify.remove(old)

    async def _watch_closes(self) -> None:
        assert self._inotify is not None and self._nursery is not None
        while True:
            await trio.lowlevel.wait_readable(self._inotify.fd)
            for wd, mask in self._inotify.read():
                if mask & _IN_Q_OVERFLOW:
                    log.warning("inotify queue overflowed: some closes of bypassed files were not seen; "
                                "their sizes reach other nodes at this node's next export scan")
                with self._lock:
                    watched = self._watches.pop(wd, None) if mask & _IN_IGNORED else self._watches.get(wd)
                if watched is not None and mask & _IN_CLOSE_WRITE and not mask & _IN_IGNORED:
                    self._nursery.start_soon(self._closed_by_event, *watched)

    async def _closed_by_event(self, path: str, ino: int) -> None:
        try:
            if os.lstat(os.path.join(self.ns.export.root, *split_path(path))).st_ino != ino:
                return  # renamed away or replaced: this name is not the file that was closed
            await self.changed_here(path)
        except (OSError, PeerUnavailable) as exc:
            log.info("announcing the close of %s (written through the bypass) failed: %s", path, exc)


__all__ = ["PROTOCOL", "XATTR", "BypassServer", "socket_path"]
