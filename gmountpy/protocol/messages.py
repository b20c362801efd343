"""Every operation a node answers: what it takes and what it answers, in one place.

A request here is a frozen dataclass whose fields are the operation's
arguments in wire order; its `decode` checks a reply and gives it a type.
Callers use `ask` of gmountpy.protocol.client.ClusterClient (a daemon's PeerPool is one):

    reply = await peers.ask(node, Open(path, os.O_RDONLY))
    reply.handle, reply.attr

The wire format is untouched: arguments still travel as a msgpack list and
replies as the lists, maps and scalars the service returns (`to_wire` gives
that shape back), so nodes running older and newer code still agree. A
reply of the wrong shape raises OSError(EPROTO) naming the operation: the
other node speaks another version of the protocol.

Operations that act on a connection's handles (service.HANDLE_OPS) take the
handle number the `open`, `opendir` or `put_open` reply gave, on the same
connection.
"""

from __future__ import annotations

import dataclasses
import errno
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypedDict, TypeVar, cast

from .attr import Attr

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", covariant=True)
T = TypeVar("T")


def _malformed(what: str, value: Any) -> OSError:
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return OSError(errno.EPROTO, f"malformed {what} reply: {shown} (do both nodes run the same gmountpy?)")


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _malformed(what, value)
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _malformed(what, value)
    return value


def _bytes(value: Any, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise _malformed(what, value)
    return value


def _list(value: Any, what: str, length: int | None = None) -> list[Any]:
    """A msgpack array (a tuple before it went over the wire, when a node calls itself)."""
    if not isinstance(value, list | tuple) or (length is not None and len(value) != length):
        raise _malformed(what, value)
    return list(value)


def _dict(value: Any, what: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict) or any(key not in value for key in keys):
        raise _malformed(what, value)
    return value


def _attr(value: Any, what: str) -> Attr:
    if type(value) is Attr:  # a node's call to itself: made by Export, never over the wire
        return value
    if not isinstance(value, list | tuple):
        raise _malformed(what, value)
    try:
        return Attr.from_wire(value)
    except ValueError:
        raise _malformed(what, value) from None


def _none(value: Any, what: str) -> None:
    if value is not None:
        raise _malformed(what, value)


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise _malformed(what, value)
    return value


def _float(value: Any, what: str) -> float:
    """Seconds: a float, or an int from a node configured with whole seconds."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _malformed(what, value)
    return float(value)


def _optional_str(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _ints(value: Any, what: str) -> tuple[int, ...]:
    return tuple(_int(v, what) for v in _list(value, what))


def _to_wire(value: Any) -> Any:
    """A decoded reply as it was on the wire (for a reply that carries another request's reply)."""
    if hasattr(value, "to_wire"):
        return value.to_wire()
    if isinstance(value, list | tuple):
        return [_to_wire(item) for item in value]
    return value


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class ReplicaSource:
    """Where a staged replica was copied from, and the source's size and mtime then."""

    node: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class LocateReply:
    """`locate`: the file's attributes here, and its source if it is a staged replica."""

    attr: Attr
    replica: ReplicaSource | None

    @classmethod
    def from_wire(cls, value: Any) -> LocateReply:
        attr, replica = _list(value, "locate", 2)
        if replica is None:
            return cls(_attr(attr, "locate"), None)
        node, size, mtime_ns = _list(replica, "locate", 3)
        return cls(_attr(attr, "locate"),
                   ReplicaSource(_str(node, "locate"), _int(size, "locate"), _int(mtime_ns, "locate")))

    def to_wire(self) -> list[Any]:
        replica = self.replica
        return [list(self.attr), None if replica is None else [replica.node, replica.size, replica.mtime_ns]]


@dataclass(frozen=True)
class ChecksumReply:
    size: int
    sha256: str

    @classmethod
    def from_wire(cls, value: Any) -> ChecksumReply:
        size, sha256 = _list(value, "checksum", 2)
        return cls(_int(size, "checksum"), _str(sha256, "checksum"))

    def to_wire(self) -> list[Any]:
        return [self.size, self.sha256]


class DirEntry(NamedTuple):
    """One entry of a node's own listing; a staged replica's carries its source node.

    A named tuple, not a dataclass: a listing has up to service.LISTDIR_MAX of them, and
    making a tuple costs a third of a frozen dataclass.
    """

    name: str
    attr: Attr
    replica_of: str | None = None

    @classmethod
    def from_wire(cls, value: Any) -> DirEntry:
        if isinstance(value, list | tuple) and 2 <= len(value) <= 3 and isinstance(value[0], str):
            replica_of = value[2] if len(value) == 3 else None
            if replica_of is None or isinstance(replica_of, str):
                return cls(value[0], _attr(value[1], "directory entry"), replica_of)
        raise _malformed("directory entry", value)

    def to_wire(self) -> list[Any]:
        if self.replica_of is None:
            return [self.name, list(self.attr)]
        return [self.name, list(self.attr), self.replica_of]


def _entries(value: Any, what: str) -> list[DirEntry]:
    return [DirEntry.from_wire(entry) for entry in _list(value, what)]


@dataclass(frozen=True)
class OpendirReply:
    """`opendir`: the listing snapshot's handle and how many entries it has."""

    handle: int
    count: int

    @classmethod
    def from_wire(cls, value: Any) -> OpendirReply:
        handle, count = _list(value, "opendir", 2)
        return cls(_int(handle, "opendir"), _int(count, "opendir"))

    def to_wire(self) -> list[Any]:
        return [self.handle, self.count]


@dataclass(frozen=True)
class OpenReply:
    """`open`: a handle on the holder (for read/write/fstat/close) and the file's attributes."""

    handle: int
    attr: Attr

    @classmethod
    def from_wire(cls, value: Any) -> OpenReply:
        handle, attr = _list(value, "open", 2)
        return cls(_int(handle, "open"), _attr(attr, "open"))

    def to_wire(self) -> list[Any]:
        return [self.handle, list(self.attr)]


@dataclass(frozen=True)
class LsEntry:
    """One name of a merged listing: the holder a lookup finds, and every holder, nearest first."""

    name: str
    node: str
    attr: Attr
    holders: tuple[str, ...]

    @classmethod
    def from_wire(cls, value: Any) -> LsEntry:
        name, node, attr, holders = _list(value, "ls entry", 4)
        return cls(_str(name, "ls"), _str(node, "ls"), _attr(attr, "ls"),
                   tuple(_str(h, "ls") for h in _list(holders, "ls")))

    def to_wire(self) -> list[Any]:
        return [self.name, self.node, list(self.attr), list(self.holders)]


@dataclass(frozen=True)
class LsReply:
    """`ls`: the merged listing as the asked node's mount shows it, and the nodes that did not answer."""

    entries: tuple[LsEntry, ...]
    unreachable: tuple[str, ...]

    @classmethod
    def from_wire(cls, value: Any) -> LsReply:
        fields = _dict(value, "ls", ("entries", "unreachable"))
        return cls(tuple(LsEntry.from_wire(e) for e in _list(fields["entries"], "ls")),
                   tuple(_str(n, "ls") for n in _list(fields["unreachable"], "ls")))

    def to_wire(self) -> dict[str, Any]:
        return {"unreachable": list(self.unreachable), "entries": [e.to_wire() for e in self.entries]}


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


class HolderRow(TypedDict):
    """One holder in a `where` reply (api.Holder is made from it)."""

    node: str
    site: str
    size: int
    mtime_ns: int
    mode: int
    export_path: str
    rtt_ms: float
    replica_of: str | None


class StageReply(TypedDict):
    """`stage`: what staging one file to the asked node did ("copied", "up-to-date", or "local")."""

    status: str
    source: str
    size: int
    sha256: str | None
    seconds: float


class JobRow(TypedDict):
    """One job in a `jobs` reply: a job started on the node's machine (gmountpy.cluster.registry)."""

    cluster: str
    node: str        # the node it runs on
    job: str         # what it is: a make target, a Snakemake rule, a command
    kind: str        # who started it: "make", "snakemake", "api"
    directory: str   # its working directory in the namespace
    started: float   # seconds since the epoch
    host: str        # the machine that started it
    pid: int         # there, a process that lives as long as the job


def _typed_dict(value: Any, what: str, kind: type[Any]) -> Any:
    return _dict(value, what, tuple(kind.__required_keys__))


# --------------------------------------------------------------------------- requests


class Request(Generic[R]):
    """One operation's arguments. `op` names it on the wire; `decode` checks and types its reply."""

    op: ClassVar[str]

    def args(self) -> list[Any]:
        """The arguments in wire order (the dataclass fields, in order)."""
        instance = cast("DataclassInstance", self)
        return [getattr(self, f.name) for f in dataclasses.fields(instance)]

    def decode(self, value: Any) -> R:
        raise NotImplementedError


# -- the node's own service (service.NodeService.op_*) ----------------------------------


@dataclass(frozen=True)
class Ping(Request[PingReply]):
    op = "ping"

    def decode(self, value: Any) -> PingReply:
        return cast(PingReply, _typed_dict(value, self.op, PingReply))


@dataclass(frozen=True)
class Counters(Request[dict[str, int]]):
    op = "counters"

    def decode(self, value: Any) -> dict[str, int]:
        if not isinstance(value, dict):
            raise _malformed(self.op, value)
        return {_str(k, self.op): _int(v, self.op) for k, v in value.items()}


@dataclass(frozen=True)
class Rescan(Request[int]):
    """Look for changes made straight in the node's export now, not at its next scan (lookup =
    "index": tell the homes); how many directories were sent (0 under flooding: nothing to tell)."""

    op = "rescan"

    def decode(self, value: Any) -> int:
        return _int(value, self.op)


@dataclass(frozen=True)
class Lookup(Request[Attr | None]):
    """The attributes if the node holds `path`, None if not."""

    op = "lookup"
    path: str

    def decode(self, value: Any) -> Attr | None:
        return None if value is None else _attr(value, self.op)


@dataclass(frozen=True)
class Locate(Request[LocateReply | None]):
    """Like lookup, plus the source when the node's copy is a staged replica."""

    op = "locate"
    path: str

    def decode(self, value: Any) -> LocateReply | None:
        return None if value is None else LocateReply.from_wire(value)


@dataclass(frozen=True)
class DropReplica(Request[bool]):
    op = "drop_replica"
    path: str
    source_size: int
    source_mtime_ns: int

    def decode(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _malformed(self.op, value)
        return value


@dataclass(frozen=True)
class Checksum(Request[ChecksumReply]):
    op = "checksum"
    path: str

    def decode(self, value: Any) -> ChecksumReply:
        return ChecksumReply.from_wire(value)


@dataclass(frozen=True)
class Listdir(Request[list[DirEntry] | None]):
    """The node's own entries of a directory, None if it has no such directory (EFBIG: use Opendir)."""

    op = "listdir"
    path: str

    def decode(self, value: Any) -> list[DirEntry] | None:
        return None if value is None else _entries(value, self.op)


@dataclass(frozen=True)
class Opendir(Request[OpendirReply | None]):
    op = "opendir"
    path: str

    def decode(self, value: Any) -> OpendirReply | None:
        return None if value is None else OpendirReply.from_wire(value)


@dataclass(frozen=True)
class Readdir(Request[list[DirEntry]]):
    op = "readdir"
    handle: int
    start: int
    count: int

    def decode(self, value: Any) -> list[DirEntry]:
        return _entries(value, self.op)


@dataclass(frozen=True)
class Closedir(Request[None]):
    op = "closedir"
    handle: int

    def decode(self, value: Any) -> None:
        _none(value, self.op)


@dataclass(frozen=True)
class Statfs(Request[tuple[int, ...]]):
    op = "statfs"

    def decode(self, value: Any) -> tuple[int, ...]:
        return tuple(_int(v, self.op) for v in _list(value, self.op))


@dataclass(frozen=True)
class Readlink(Request[str]):
    op = "readlink"
    path: str

    def decode(self, value: Any) -> str:
        return _str(value, self.op)


class _AttrReply(Request[Attr]):
    def decode(self, value: Any) -> Attr:
        return _attr(value, self.op)


class _NoReply(Request[None]):
    def decode(self, value: Any) -> None:
        _none(value, self.op)


@dataclass(frozen=True)
class Mkdir(_AttrReply):
    op = "mkdir"
    path: str
    mode: int


@dataclass(frozen=True)
class Unlink(_NoReply):
    op = "unlink"
    path: str


@dataclass(frozen=True)
class Rmdir(_NoReply):
    op = "rmdir"
    path: str


@dataclass(frozen=True)
class Rename(_NoReply):
    op = "rename"
    src: str
    dst: str


@dataclass(frozen=True)
class Chmod(_AttrReply):
    op = "chmod"
    path: str
    mode: int


@dataclass(frozen=True)
class Truncate(_AttrReply):
    op = "truncate"
    path: str
    size: int


@dataclass(frozen=True)
class Utimens(_AttrReply):
    op = "utimens"
    path: str
    atime_ns: int | None
    mtime_ns: int | None


@dataclass(frozen=True)
class Symlink(_AttrReply):
    op = "symlink"
    target: str
    path: str


@dataclass(frozen=True)
class Mknod(_AttrReply):
    op = "mknod"
    path: str
    mode: int
    rdev: int


@dataclass(frozen=True)
class Link(_AttrReply):
    op = "link"
    src: str
    dst: str


@dataclass(frozen=True)
class Chown(_AttrReply):
    """-1 keeps an id."""

    op = "chown"
    path: str
    uid: int
    gid: int


@dataclass(frozen=True)
class Getxattr(Request[bytes]):
    op = "getxattr"
    path: str
    name: str

    def decode(self, value: Any) -> bytes:
        return _bytes(value, self.op)


@dataclass(frozen=True)
class Setxattr(_NoReply):
    op = "setxattr"
    path: str
    name: str
    value: bytes


@dataclass(frozen=True)
class Listxattr(Request[list[str]]):
    op = "listxattr"
    path: str

    def decode(self, value: Any) -> list[str]:
        return [_str(name, self.op) for name in _list(value, self.op)]


@dataclass(frozen=True)
class Removexattr(_NoReply):
    op = "removexattr"
    path: str
    name: str


# -- file data, through handles owned by the connection

@dataclass(frozen=True)
class Open(Request[OpenReply]):
    op = "open"
    path: str
    flags: int

    def decode(self, value: Any) -> OpenReply:
        return OpenReply.from_wire(value)


@dataclass(frozen=True)
class Read(Request[bytes]):
    """At most service.MAX_IO bytes; fewer at the end of the file."""

    op = "read"
    handle: int
    offset: int
    size: int

    def decode(self, value: Any) -> bytes:
        return _bytes(value, self.op)


@dataclass(frozen=True)
class Write(Request[int]):
    """At most service.MAX_IO bytes; answers how many were written."""

    op = "write"
    handle: int
    offset: int
    data: bytes

    def decode(self, value: Any) -> int:
        return _int(value, self.op)


@dataclass(frozen=True)
class Fsync(_NoReply):
    op = "fsync"
    handle: int
    datasync: bool


@dataclass(frozen=True)
class Fstat(_AttrReply):
    op = "fstat"
    handle: int


@dataclass(frozen=True)
class Ftruncate(_AttrReply):
    op = "ftruncate"
    handle: int
    size: int


@dataclass(frozen=True)
class Close(_NoReply):
    op = "close"
    handle: int


# -- whole files written from outside the mount: put_open, write..., put_close (or put_abort)

@dataclass(frozen=True)
class PutOpen(Request[int]):
    """A hidden temporary file beside `path`; the handle takes `write` calls."""

    op = "put_open"
    path: str
    mode: int

    def decode(self, value: Any) -> int:
        return _int(value, self.op)


@dataclass(frozen=True)
class PutClose(_AttrReply):
    """Verify (size, sha256) of what landed on disk, then rename it into place."""

    op = "put_close"
    handle: int
    size: int
    sha256: str


@dataclass(frozen=True)
class PutAbort(_NoReply):
    op = "put_abort"
    handle: int


# -- what the daemon adds (node/daemon.py): the namespace as the node's mount sees it, control

@dataclass(frozen=True)
class Where(Request[list[HolderRow]]):
    """Every holder of `path`, nearest to the asked node first."""

    op = "where"
    path: str

    def decode(self, value: Any) -> list[HolderRow]:
        return [cast(HolderRow, _typed_dict(row, self.op, HolderRow)) for row in _list(value, self.op)]


@dataclass(frozen=True)
class Ls(Request[LsReply]):
    op = "ls"
    path: str

    def decode(self, value: Any) -> LsReply:
        return LsReply.from_wire(value)


@dataclass(frozen=True)
class Remove(Request[list[str]]):
    """unlink or rmdir through the asked node's namespace, as its mount would: every holder,
    and its home, before the reply (the library API's `remove`); the nodes it was removed from."""

    op = "remove"
    path: str

    def decode(self, value: Any) -> list[str]:
        return [_str(node, self.op) for node in _list(value, self.op)]


@dataclass(frozen=True)
class Created(_NoReply):
    """A peer created `path`: forget "not found" for it."""

    op = "created"
    path: str
    is_dir: bool


@dataclass(frozen=True)
class Stage(Request[StageReply]):
    """Copy `path` to the asked node as a verified replica."""

    op = "stage"
    path: str

    def decode(self, value: Any) -> StageReply:
        return cast(StageReply, _typed_dict(value, self.op, StageReply))


@dataclass(frozen=True)
class Stats(Request[dict[str, Any]]):
    """The daemon's counters for `gmount status` and tests (inodes, cache hits, limits in use)."""

    op = "stats"

    def decode(self, value: Any) -> dict[str, Any]:
        return _dict(value, self.op, ("node", "pid"))


@dataclass(frozen=True)
class Jobs(Request[list[JobRow]]):
    """The jobs started on the asked node's machine for its cluster and still running, oldest first."""

    op = "jobs"

    def decode(self, value: Any) -> list[JobRow]:
        return [cast(JobRow, _typed_dict(row, self.op, JobRow)) for row in _list(value, self.op)]


@dataclass(frozen=True)
class SetPeers(_NoReply):
    """node name -> [host, port]: a node was (re)started elsewhere."""

    op = "set_peers"
    table: dict[str, list[Any]]


@dataclass(frozen=True)
class RenewTls(Request[str]):
    """Present this certificate from now on; answers its expiry."""

    op = "renew_tls"
    cert: str
    key: str

    def decode(self, value: Any) -> str:
        return _str(value, self.op)


@dataclass(frozen=True)
class Shutdown(_NoReply):
    op = "shutdown"


# -- the homed directory index (node/index.py; lookup = "index" or "central") -------------------
#
# DirectoryIndex answers for the directories a node is the home of (or a partition's server, or a
# backup), ExportWatcher lists the node's own export for homes (and answers `rescan`, above), and
# IndexLocator takes the revocations homes send.


class IndexHolder(NamedTuple):
    """One holder of a name in a home's index: the node, the file's attributes there, and the
    node whose file it is a staged replica of (None: its own).

    A named tuple, checked inline, as DirEntry: a listing has up to service.LISTDIR_MAX names.
    """

    node: str
    attr: Attr
    replica_of: str | None

    @classmethod
    def from_wire(cls, value: Any, what: str) -> IndexHolder:
        if isinstance(value, list | tuple) and len(value) == 3:
            node, attr, replica_of = value
            if isinstance(node, str) and (replica_of is None or isinstance(replica_of, str)):
                return cls(node, _attr(attr, what), replica_of)
        raise _malformed(what, value)

    def to_wire(self) -> list[Any]:
        return [self.node, list(self.attr), self.replica_of]


def _holders(value: Any, what: str) -> list[IndexHolder]:
    if not isinstance(value, list | tuple):
        raise _malformed(what, value)
    return [IndexHolder.from_wire(holder, what) for holder in value]


class IndexRow(NamedTuple):
    """One name of a home's listing: its holders, and its home when it is a subdirectory (leased
    to the asker with the listing)."""

    name: str
    holders: tuple[IndexHolder, ...]
    home: str | None

    @classmethod
    def from_wire(cls, value: Any, what: str) -> IndexRow:
        if isinstance(value, list | tuple) and len(value) == 3:
            name, holders, home = value
            if isinstance(name, str) and (home is None or isinstance(home, str)):
                return cls(name, tuple(_holders(holders, what)), home)
        raise _malformed(what, value)

    def to_wire(self) -> list[Any]:
        return [self.name, [holder.to_wire() for holder in self.holders], self.home]


@dataclass(frozen=True)
class IndexListReply:
    """`index_list`: every name of a directory with its holders. `complete`: every node was listed
    (if not, the asker lists every node itself); `exists`: some node has the directory; `lease`:
    seconds the asker may keep the listing (0: not leased); `home_lease`: seconds the homes of the
    subdirectories are leased; `parts`: the partitions of a split directory known to the asked
    node (None: not split), whose other partitions their servers list."""

    entries: tuple[IndexRow, ...]
    complete: bool
    exists: bool
    lease: float
    home_lease: float
    parts: tuple[int, ...] | None = None

    @classmethod
    def from_wire(cls, value: Any, what: str = "index_list") -> IndexListReply:
        fields = _dict(value, what, ("entries", "complete", "exists", "lease", "home_lease"))
        parts = fields.get("parts")
        return cls(tuple(IndexRow.from_wire(row, what) for row in _list(fields["entries"], what)),
                   _bool(fields["complete"], what), _bool(fields["exists"], what), _float(fields["lease"], what),
                   _float(fields["home_lease"], what), None if parts is None else _ints(parts, what))

    def to_wire(self) -> dict[str, Any]:
        return {"entries": [row.to_wire() for row in self.entries], "complete": self.complete,
                "exists": self.exists, "lease": self.lease, "home_lease": self.home_lease,
                "parts": None if self.parts is None else list(self.parts)}


@dataclass(frozen=True)
class IndexLookupReply:
    """`index_lookup`: every holder of a name. `complete`: every node was listed; `pending`: a holder
    is creating it right now (neither "here" nor "not here" yet); `lease`: seconds the home will
    tell the asker of a create of the name (a leased "not found"; 0: not leased); `home`: a
    subdirectory's home, leased for `home_lease` seconds; `parts`: the partitions of a split
    directory known to the home (None: not split); `size`: names in the directory there (None:
    not built); `listing`: the whole directory, when asked for (`with_listing`)."""

    holders: tuple[IndexHolder, ...]
    complete: bool
    pending: bool
    lease: float
    home: str | None = None
    home_lease: float = 0.0
    parts: tuple[int, ...] | None = None
    size: int | None = None
    listing: IndexListReply | None = None

    @classmethod
    def from_wire(cls, value: Any) -> IndexLookupReply:
        what = "index_lookup"
        fields = _dict(value, what, ("holders", "complete", "pending", "lease"))
        parts, size, listing = fields.get("parts"), fields.get("size"), fields.get("listing")
        return cls(tuple(_holders(fields["holders"], what)), _bool(fields["complete"], what),
                   _bool(fields["pending"], what), _float(fields["lease"], what),
                   _optional_str(fields.get("home"), what), _float(fields.get("home_lease", 0.0), what),
                   None if parts is None else _ints(parts, what), None if size is None else _int(size, what),
                   None if listing is None else IndexListReply.from_wire(listing, what))

    def to_wire(self) -> dict[str, Any]:
        return {"holders": [holder.to_wire() for holder in self.holders], "complete": self.complete,
                "pending": self.pending, "lease": self.lease, "home": self.home, "home_lease": self.home_lease,
                "parts": None if self.parts is None else list(self.parts), "size": self.size,
                "listing": None if self.listing is None else self.listing.to_wire()}


@dataclass(frozen=True)
class PartOk(Generic[T]):
    """`index_part` served: the carried request's reply, and the partitions the server knows of."""

    result: T
    bitmap: tuple[int, ...]

    def to_wire(self) -> list[Any]:
        return ["ok", _to_wire(self.result), list(self.bitmap)]


@dataclass(frozen=True)
class PartRedirect:
    """`index_part` refused: the name is in a partition the asked node does not serve. `bitmap`:
    the partitions it knows of; the asker merges them into its map and asks where that says."""

    bitmap: tuple[int, ...]

    def to_wire(self) -> list[Any]:
        return ["redirect", list(self.bitmap)]


class SplitPayload(TypedDict):
    """What `index_split` hands the server of a new partition: its names (each holder as [name,
    node, is_dir, attr or None, replica_of, seconds since a claim or close told the home, or
    None]), the leases on them (seconds left, by asker) and what the splitting node knew of the
    directory (`missing` nodes, `exists`, the nodes holding it)."""

    home: str
    bitmap: list[int]
    partition: int
    entries: list[list[Any]]
    missing: list[str]
    exists: bool
    holders: list[str]
    negatives: dict[str, dict[str, float]]
    listing_leases: dict[str, float]
    child_homes: dict[str, str]
    home_leases: dict[str, dict[str, float]]


class IndexNameRequest(Request[R]):
    """An index operation on one name of a directory: for a split directory, the server of the
    partition the name hashes to answers it."""

    directory: str
    name: str


@dataclass(frozen=True)
class IndexLookup(IndexNameRequest[IndexLookupReply]):
    """Every holder of `name` in `directory`, from its home. `asker` (None: nothing is leased) is
    leased a "not found" and a subdirectory's home; `with_listing`: the whole directory too."""

    op = "index_lookup"
    directory: str
    name: str
    asker: str | None = None
    with_listing: bool = False

    def decode(self, value: Any) -> IndexLookupReply:
        return IndexLookupReply.from_wire(value)


@dataclass(frozen=True)
class IndexClaimReply:
    """`index_claim`: the holders of the name when it exists elsewhere (nothing was claimed);
    none: the name is the claimant's now. For a new directory: `seeded`, its index starts
    empty without a seed from the claimant (its home is the node that took the claim, or that
    node's backup, or the claimant when `keep`); `keep`, the claimant is the backup of the node
    that took the claim, which did not send it the record of the new directory's home: the
    claimant keeps that record itself (IndexRecords to itself, seeding the index if it is the home)."""

    holders: tuple[IndexHolder, ...]
    seeded: bool = False
    keep: bool = False

    @classmethod
    def from_wire(cls, value: Any) -> IndexClaimReply:
        what = "index_claim"
        holders, seeded, keep = _list(value, what, 3)
        return cls(tuple(_holders(holders, what)), _bool(seeded, what), _bool(keep, what))

    def to_wire(self) -> list[Any]:
        return [[holder.to_wire() for holder in self.holders], self.seeded, self.keep]


@dataclass(frozen=True)
class IndexClaim(IndexNameRequest[IndexClaimReply]):
    """`node` is about to create `name` (see IndexClaimReply). `exclusive` False: a parent
    directory a create makes, recorded even when the name exists elsewhere."""

    op = "index_claim"
    directory: str
    name: str
    node: str
    is_dir: bool = False
    exclusive: bool = True

    def decode(self, value: Any) -> IndexClaimReply:
        return IndexClaimReply.from_wire(value)


@dataclass(frozen=True)
class IndexSet(_NoReply, IndexNameRequest[None]):
    """`node` holds `name` with `attr` (None: the home asks it); `asker` (default `node`) made the change."""

    op = "index_set"
    directory: str
    name: str
    node: str
    attr: Attr | None
    replica_of: str | None = None
    is_dir: bool = False
    asker: str | None = None


@dataclass(frozen=True)
class IndexDrop(IndexNameRequest[list[str]]):
    """`name` is gone from `nodes` (None: from every node); `asker` removed it. A removed
    subdirectory's index is forgotten at its home (and at `index_home`, where the asker saw it
    homed) by the directory's home; the reply names the homes that did not answer (the asker
    owes them the forget). `keep`: the asker is the directory's backup and drops its copy of
    the subdirectory's record itself (no copy is sent to it)."""

    op = "index_drop"
    directory: str
    name: str
    nodes: list[str] | None = None
    asker: str | None = None
    index_home: str | None = None
    keep: bool = False

    def decode(self, value: Any) -> list[str]:
        return [_str(node, self.op) for node in _list(value, self.op)]


@dataclass(frozen=True)
class IndexReplace(_NoReply, IndexNameRequest[None]):
    """After a rename to `name` (by `asker`): exactly `nodes` hold it."""

    op = "index_replace"
    directory: str
    name: str
    nodes: list[str]
    is_dir: bool
    asker: str | None = None


@dataclass(frozen=True)
class IndexRename(_NoReply, IndexNameRequest[None]):
    """A rename within `directory` (by `asker`): `src` is gone, exactly `nodes` hold `name`. One
    message for IndexDrop and IndexReplace at the same home; EXDEV when the two names are in
    partitions of a split directory that different nodes serve (send those two instead)."""

    op = "index_rename"
    directory: str
    name: str
    src: str
    nodes: list[str]
    is_dir: bool
    asker: str | None = None


@dataclass(frozen=True)
class IndexList(Request[IndexListReply]):
    """The whole directory from its home, leased to `asker` (None: not leased)."""

    op = "index_list"
    directory: str
    asker: str | None = None

    def decode(self, value: Any) -> IndexListReply:
        return IndexListReply.from_wire(value, self.op)


@dataclass(frozen=True)
class IndexSync(_NoReply):
    """`node`'s export changed outside the mount: `changes` are the entries of `directory` new or
    changed there, as its listing has them ([name, attr] or [name, attr, replica_of]), and
    [name, None] for names gone. `covered`: the partitions of a split directory the sender
    passed them on to."""

    op = "index_sync"
    directory: str
    node: str
    changes: list[list[Any]]
    covered: list[int] | None = None


@dataclass(frozen=True)
class IndexForget(_NoReply):
    """Build the indexes of the directories under `prefixes` again when next asked (`covered`: as
    for IndexSync)."""

    op = "index_forget"
    prefixes: list[str]
    covered: list[int] | None = None


@dataclass(frozen=True)
class IndexBackup(Request[T]):
    """`request` served by a home's backup in place of `home`, which did not answer; the reply is
    `request`'s. On the wire: [home, request's op, request's arguments]."""

    op = "index_backup"
    home: str
    request: Request[T]

    def args(self) -> list[Any]:
        return [self.home, self.request.op, self.request.args()]

    def decode(self, value: Any) -> T:
        return self.request.decode(value)


@dataclass(frozen=True)
class Recorded(Request[T]):
    """`request`, a change to a file the asked node holds (chmod, utimens, truncate or unlink),
    made there and then recorded by that node at `home`, the home `asker` knows for the file's
    directory, as a change `asker` made: from an asker far from the home, one round trip, with
    the record sent from the holder, nearer the home. The reply is `request`'s. On the wire:
    [home, asker, request's op, request's arguments]."""

    op = "recorded"
    home: str
    asker: str
    request: Request[T]

    def args(self) -> list[Any]:
        return [self.home, self.asker, self.request.op, self.request.args()]

    def decode(self, value: Any) -> T:
        return self.request.decode(value)


@dataclass(frozen=True)
class IndexPart(Request[PartOk[T] | PartRedirect]):
    """`request` at the server of `partition` of a split directory, by the asker's map of its
    partitions (`bitmap`) and its `home`. On the wire: [partition, home, bitmap, request's op,
    request's arguments]; the reply ["ok", request's reply, bitmap] or ["redirect", bitmap]."""

    op = "index_part"
    partition: int
    home: str
    bitmap: list[int]
    request: Request[T]

    def args(self) -> list[Any]:
        return [self.partition, self.home, self.bitmap, self.request.op, self.request.args()]

    def decode(self, value: Any) -> PartOk[T] | PartRedirect:
        reply = _list(value, self.op)
        if len(reply) == 3 and reply[0] == "ok":
            return PartOk(self.request.decode(reply[1]), _ints(reply[2], self.op))
        if len(reply) == 2 and reply[0] == "redirect":
            return PartRedirect(_ints(reply[1], self.op))
        raise _malformed(self.op, value)


@dataclass(frozen=True)
class IndexRecords(Request[dict[str, str]]):
    """The homes of `directory`'s subdirectories that its home keeps on the asked node, its backup:
    `updates` applied (a None home: removed), and then none returned; without `updates`, all of
    them. Name -> home. A removed subdirectory's index kept on the asked node goes too (the
    directory is gone: its home's backup is its likeliest other home). `seed`: the node that just made
    the new subdirectories in `updates`; those homed at the asked node start with an empty index
    there (IndexSeed, in the same message)."""

    op = "index_records"
    directory: str
    updates: dict[str, str | None] | None = None
    seed: str | None = None

    def decode(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            raise _malformed(self.op, value)
        return {_str(name, self.op): _str(home, self.op) for name, home in value.items()}


@dataclass(frozen=True)
class IndexSeed(_NoReply):
    """`directory` was just made on `node` by a mkdir through the mount: its index starts empty."""

    op = "index_seed"
    directory: str
    node: str | None = None


@dataclass(frozen=True)
class IndexAdopt(_NoReply):
    """`directory` appeared on `node` outside the mount: its home lists it there now."""

    op = "index_adopt"
    directory: str
    node: str


@dataclass(frozen=True)
class IndexSplit(_NoReply):
    """Serve the partition of `directory` the sender split off (`payload`)."""

    op = "index_split"
    directory: str
    payload: SplitPayload


@dataclass(frozen=True)
class IndexParts(_NoReply):
    """A partition of `directory` split: the partitions known now (`bitmap`), for its `home`."""

    op = "index_parts"
    directory: str
    home: str
    bitmap: list[int]


@dataclass(frozen=True)
class IndexListdir(Request[list[DirEntry] | None]):
    """The asked node's own entries of `directory` (as `listdir`; EFBIG: page with Opendir), for the
    directory's `home`: the node watches it from now on and tells `home` of changes made outside
    the mount (IndexSync)."""

    op = "index_listdir"
    directory: str
    home: str | None = None

    def decode(self, value: Any) -> list[DirEntry] | None:
        return None if value is None else _entries(value, self.op)


@dataclass(frozen=True)
class IndexUnhome(_NoReply):
    """Revoked by a home: the directories under `prefixes` are gone or moved; forget their homes,
    listings and "not found" (`indexes`: and this node's own indexes of them)."""

    op = "index_unhome"
    prefixes: list[str]
    indexes: bool = False


@dataclass(frozen=True)
class IndexUnlist(_NoReply):
    """Revoked by its home: the listing of `directory` changed."""

    op = "index_unlist"
    directory: str


def _all_requests() -> dict[str, type[Request[Any]]]:
    found: dict[str, type[Request[Any]]] = {}
    pending: list[type[Request[Any]]] = [Request]
    while pending:
        for kind in pending.pop().__subclasses__():
            pending.append(kind)
            if "op" in vars(kind):
                found[kind.op] = kind
    return found


#: op name -> its request type: the whole RPC surface of a node.
REQUESTS: dict[str, type[Request[Any]]] = _all_requests()
