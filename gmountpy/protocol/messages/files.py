"""What a node answers of its own export (gmountpy.node.service): metadata, file data through
handles, and whole files written from outside the mount.

Operations that act on a connection's handles (service.HANDLE_OPS) take the handle
number the `open`, `opendir` or `put_open` reply gave, on the same connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple, TypedDict

from ..attr import Attr
from ..codec import MaxLen, Range
from .base import (
    MAX_IO,
    Count,
    Handle,
    Message,
    Mode,
    Nanoseconds,
    Offset,
    Pathname,
    Request,
    Size,
)

#: Extended attributes: a name and a value of at most this much (Linux's XATTR_NAME_MAX, XATTR_SIZE_MAX).
XattrName = Annotated[str, MaxLen(255)]
XattrValue = Annotated[bytes, MaxLen(65536)]

# --------------------------------------------------------------------------- replies


class PingReply(TypedDict):
    """`ping`: who the node is, its daemon's pid and its byte counters (service.IOCounters)."""

    node: str
    site: str
    cluster: str
    version: str
    mountpoint: str
    export: str
    pid: int
    counters: dict[str, int]


@dataclass(frozen=True)
class ReplicaSource(Message):
    """Where a staged replica was copied from, and the source's size and mtime then."""

    node: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class LocateReply(Message):
    """`locate`: the file's attributes here, and its source if it is a staged replica."""

    attr: Attr
    replica: ReplicaSource | None


@dataclass(frozen=True)
class ChecksumReply(Message):
    size: int
    sha256: str


class DirEntry(NamedTuple):
    """One entry of a node's own listing; a staged replica's carries its source node.

    A named tuple, not a dataclass: a listing has up to service.LISTDIR_MAX of them, making a
    tuple costs a third of a frozen dataclass, and msgpack sends a tuple as it is.
    """

    name: str
    attr: Attr
    replica_of: str | None = None


@dataclass(frozen=True)
class OpendirReply(Message):
    """`opendir`: the listing snapshot's handle and how many entries it has."""

    handle: int
    count: int


@dataclass(frozen=True)
class OpenReply(Message):
    """`open`: a handle on the holder (for read/write/fstat/close) and the file's attributes."""

    handle: int
    attr: Attr


# --------------------------------------------------------------------------- who the node is


@dataclass(frozen=True)
class Ping(Request[PingReply]):
    op = "ping"


@dataclass(frozen=True)
class Counters(Request[dict[str, int]]):
    """The node's byte counters (service.IOCounters)."""

    op = "counters"


@dataclass(frozen=True)
class Rescan(Request[int]):
    """Look for changes made straight in the node's export now, not at its next scan (lookup =
    "index": tell the homes); how many directories were sent (0 under flooding: nothing to tell)."""

    op = "rescan"


# --------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class Lookup(Request[Attr | None]):
    """The attributes if the node holds `path`, None if not."""

    op = "lookup"
    path: Pathname


@dataclass(frozen=True)
class Locate(Request[LocateReply | None]):
    """Like lookup, plus the source when the node's copy is a staged replica."""

    op = "locate"
    path: Pathname


@dataclass(frozen=True)
class DropReplica(Request[bool]):
    """Remove a stale replica (its source changed); never an ordinary file. Whether it went."""

    op = "drop_replica"
    path: Pathname
    source_size: Size
    source_mtime_ns: Nanoseconds


@dataclass(frozen=True)
class Checksum(Request[ChecksumReply]):
    op = "checksum"
    path: Pathname


@dataclass(frozen=True)
class Listdir(Request[list[DirEntry] | None]):
    """The node's own entries of a directory, None if it has no such directory (EFBIG: use Opendir)."""

    op = "listdir"
    path: Pathname


@dataclass(frozen=True)
class Opendir(Request[OpendirReply | None]):
    op = "opendir"
    path: Pathname


@dataclass(frozen=True)
class Readdir(Request[list[DirEntry]]):
    """At most `count` entries (and at most service.LISTDIR_MAX) of a snapshot, from `start`."""

    op = "readdir"
    handle: Handle
    start: Count
    count: Count


@dataclass(frozen=True)
class Closedir(Request[None]):
    op = "closedir"
    handle: Handle


@dataclass(frozen=True)
class Statfs(Request[tuple[int, ...]]):
    op = "statfs"


@dataclass(frozen=True)
class Readlink(Request[str]):
    op = "readlink"
    path: Pathname


@dataclass(frozen=True)
class Mkdir(Request[Attr]):
    op = "mkdir"
    path: Pathname
    mode: Mode


@dataclass(frozen=True)
class Unlink(Request[None]):
    op = "unlink"
    path: Pathname


@dataclass(frozen=True)
class Rmdir(Request[None]):
    op = "rmdir"
    path: Pathname


@dataclass(frozen=True)
class Rename(Request[None]):
    op = "rename"
    src: Pathname
    dst: Pathname


@dataclass(frozen=True)
class Chmod(Request[Attr]):
    op = "chmod"
    path: Pathname
    mode: Mode


@dataclass(frozen=True)
class Truncate(Request[Attr]):
    op = "truncate"
    path: Pathname
    size: Size


@dataclass(frozen=True)
class Utimens(Request[Attr]):
    """None keeps a time."""

    op = "utimens"
    path: Pathname
    atime_ns: Nanoseconds | None
    mtime_ns: Nanoseconds | None


@dataclass(frozen=True)
class Symlink(Request[Attr]):
    op = "symlink"
    target: Pathname
    path: Pathname


@dataclass(frozen=True)
class Mknod(Request[Attr]):
    op = "mknod"
    path: Pathname
    mode: Mode
    rdev: Annotated[int, Range(0, 2**64 - 1)]


@dataclass(frozen=True)
class Link(Request[Attr]):
    op = "link"
    src: Pathname
    dst: Pathname


@dataclass(frozen=True)
class Chown(Request[Attr]):
    """-1 keeps an id."""

    op = "chown"
    path: Pathname
    uid: Annotated[int, Range(-1, 2**32 - 1)]
    gid: Annotated[int, Range(-1, 2**32 - 1)]


@dataclass(frozen=True)
class Getxattr(Request[bytes]):
    op = "getxattr"
    path: Pathname
    name: XattrName


@dataclass(frozen=True)
class Setxattr(Request[None]):
    """Only `user.*` attributes (EOPNOTSUPP for others)."""

    op = "setxattr"
    path: Pathname
    name: XattrName
    value: XattrValue


@dataclass(frozen=True)
class Listxattr(Request[list[str]]):
    op = "listxattr"
    path: Pathname


@dataclass(frozen=True)
class Removexattr(Request[None]):
    op = "removexattr"
    path: Pathname
    name: XattrName


# --------------------------------------------------------------------------- file data, through handles


@dataclass(frozen=True)
class Open(Request[OpenReply]):
    op = "open"
    path: Pathname
    flags: Annotated[int, Range(0, 2**31 - 1)]


@dataclass(frozen=True)
class Read(Request[bytes]):
    """At most MAX_IO bytes; fewer at the end of the file."""

    op = "read"
    handle: Handle
    offset: Offset
    size: Annotated[int, Range(0, MAX_IO)]


@dataclass(frozen=True)
class Write(Request[int]):
    """At most MAX_IO bytes; answers how many were written."""

    op = "write"
    handle: Handle
    offset: Offset
    data: Annotated[bytes, MaxLen(MAX_IO)]


@dataclass(frozen=True)
class Fsync(Request[None]):
    op = "fsync"
    handle: Handle
    datasync: bool


@dataclass(frozen=True)
class Fstat(Request[Attr]):
    op = "fstat"
    handle: Handle


@dataclass(frozen=True)
class Ftruncate(Request[Attr]):
    op = "ftruncate"
    handle: Handle
    size: Size


@dataclass(frozen=True)
class Close(Request[None]):
    op = "close"
    handle: Handle


@dataclass(frozen=True)
class Settle(Request[int]):
    """Retire `handle` for a new one of the same open file, answered once every call on it that the node
    has begun has returned; a call on the old number that has not begun is refused (EBADF). After a write
    that got no reply, what lands of it has landed when this answers: close(2) asks it."""

    op = "settle"
    handle: Handle


# --------------------------------------------------------------------------- whole files from outside the mount
# put_open, write..., put_close (or put_abort)


@dataclass(frozen=True)
class PutOpen(Request[int]):
    """A hidden temporary file beside `path`; the handle takes `write` calls."""

    op = "put_open"
    path: Pathname
    mode: Mode


@dataclass(frozen=True)
class PutClose(Request[Attr]):
    """Verify (size, sha256) of what landed on disk, then rename it into place."""

    op = "put_close"
    handle: Handle
    size: Size
    sha256: Annotated[str, MaxLen(64)]


@dataclass(frozen=True)
class PutAbort(Request[None]):
    op = "put_abort"
    handle: Handle

