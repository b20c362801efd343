"""Every operation a node answers: what it takes and what it answers, typed.

A request is a frozen dataclass whose fields are the operation's arguments in wire
order, and whose base names its reply type (`Request[Attr | None]`); both wire forms
are derived from those annotations (gmountpy.protocol.codec). Callers use `ask` of
gmountpy.protocol.client.ClusterClient (a daemon's PeerPool is one):

    reply = await peers.ask(node, Open(path, os.O_RDONLY))
    reply.handle, reply.attr

A node decodes every request it receives through its type before any handler runs
(gmountpy.node.service.NodeService.dispatch): arguments that do not fit are refused
with EINVAL naming the operation and the field. A reply that does not fit raises
OSError(EPROTO) naming the operation: the other node speaks another version of the
protocol (nodes of different wire versions do not even connect: wire.VERSION).

Adding an operation is one dataclass here, in the module of its concern -- `files`
(a node's own export), `control` (a whole node), `index` (the directory index) --
and one handler taking it (see node.service and node.control).
"""

from .base import (
    MAX_IO,
    NAME_MAX,
    PATH_MAX,
    REQUESTS,
    Carrying,
    Message,
    Operations,
    R,
    Request,
    T,
    malformed_reply,
    operations,
)
from .control import (
    Created,
    HolderRow,
    JobRow,
    Jobs,
    Ls,
    LsEntry,
    LsReply,
    Remove,
    RenewTls,
    SetPeers,
    Shutdown,
    Stage,
    StageReply,
    Stats,
    Where,
)
from .files import (
    Checksum,
    ChecksumReply,
    Chmod,
    Chown,
    Close,
    Closedir,
    Counters,
    DirEntry,
    DropReplica,
    Fstat,
    Fsync,
    Ftruncate,
    Getxattr,
    Link,
    Listdir,
    Listxattr,
    Locate,
    LocateReply,
    Lookup,
    Mkdir,
    Mknod,
    Open,
    Opendir,
    OpendirReply,
    OpenReply,
    Ping,
    PingReply,
    PutAbort,
    PutClose,
    PutOpen,
    Read,
    Readdir,
    Readlink,
    Removexattr,
    Rename,
    ReplicaSource,
    Rescan,
    Rmdir,
    Settle,
    Setxattr,
    Statfs,
    Symlink,
    Truncate,
    Unlink,
    Utimens,
    Write,
)
from .index import (
    MAX_PARTITIONS,
    IndexAdopt,
    IndexBackup,
    IndexClaim,
    IndexClaimReply,
    IndexDrop,
    IndexForget,
    IndexHolder,
    IndexList,
    IndexListdir,
    IndexListReply,
    IndexLookup,
    IndexLookupReply,
    IndexNameRequest,
    IndexOwned,
    IndexPart,
    IndexParts,
    IndexRecords,
    IndexRename,
    IndexReplace,
    IndexRow,
    IndexSeed,
    IndexSet,
    IndexSplit,
    IndexSync,
    IndexUnhome,
    IndexUnlist,
    PartOk,
    PartRedirect,
    Recorded,
    SplitEntry,
    SplitPayload,
    SyncEntry,
)

__all__ = [
    "Carrying", "Checksum", "ChecksumReply", "Chmod", "Chown", "Close", "Closedir", "Counters", "Created",
    "DirEntry", "DropReplica", "Fstat", "Fsync", "Ftruncate", "Getxattr", "HolderRow", "IndexAdopt", "IndexBackup",
    "IndexClaim", "IndexClaimReply", "IndexDrop", "IndexForget", "IndexHolder", "IndexList", "IndexListReply",
    "IndexListdir", "IndexLookup", "IndexLookupReply", "IndexNameRequest", "IndexOwned", "IndexPart", "IndexParts",
    "IndexRecords", "IndexRename", "IndexReplace", "IndexRow", "IndexSeed", "IndexSet", "IndexSplit", "IndexSync",
    "IndexUnhome", "IndexUnlist", "JobRow", "Jobs", "Link", "Listdir", "Listxattr", "Locate", "LocateReply",
    "Lookup", "Ls", "LsEntry", "LsReply", "MAX_IO", "MAX_PARTITIONS", "Message", "Mkdir", "Mknod", "NAME_MAX",
    "Open", "OpenReply", "Opendir", "OpendirReply", "Operations", "PATH_MAX", "PartOk", "PartRedirect", "Ping",
    "PingReply", "PutAbort", "PutClose", "PutOpen", "R", "REQUESTS", "Read", "Readdir", "Readlink", "Recorded",
    "Remove", "Removexattr", "Rename", "RenewTls", "ReplicaSource", "Request", "Rescan", "Rmdir", "SetPeers",
    "Settle", "Setxattr", "Shutdown", "SplitEntry", "SplitPayload", "Stage", "StageReply", "Statfs", "Stats", "Symlink",
    "SyncEntry", "T", "Truncate", "Unlink", "Utimens", "Where", "Write", "malformed_reply", "operations",
]
