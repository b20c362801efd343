"""The homed directory index (gmountpy.node.index; lookup = "index" or "central").

DirectoryIndex answers for the directories a node is the home of (or a partition's
server, or a backup), ExportWatcher lists the node's own export for homes (and answers
`rescan`), and IndexLocator takes the revocations homes send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Generic, NamedTuple

from ..attr import Attr
from ..codec import Codec, Range, WireError, codec
from .base import Carrying, Message, Name, NodeName, Pathname, R, Request, T, malformed_reply
from .files import DirEntry

#: Partitions a split directory may have at most (Giga+: 2**12).
MAX_PARTITIONS = 1 << 12
Partition = Annotated[int, Range(0, MAX_PARTITIONS - 1)]
#: The partitions of a split directory known to a node.
Bitmap = list[Partition]


# --------------------------------------------------------------------------- replies


class IndexHolder(NamedTuple):
    """One holder of a name in a home's index: the node, the file's attributes there, and the
    node whose file it is a staged replica of (None: its own). A named tuple, as DirEntry: a
    listing has up to service.LISTDIR_MAX names."""

    node: str
    attr: Attr
    replica_of: str | None


class IndexRow(NamedTuple):
    """One name of a home's listing: its holders, and its home when it is a subdirectory (leased
    to the asker with the listing)."""

    name: str
    holders: tuple[IndexHolder, ...]
    home: str | None


@dataclass(frozen=True)
class IndexListReply(Message):
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


@dataclass(frozen=True)
class IndexLookupReply(Message):
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


@dataclass(frozen=True)
class IndexClaimReply(Message):
    """`index_claim`: the holders of the name when it exists elsewhere (nothing was claimed);
    none: the name is the claimant's now. For a new directory: `seeded`, its index starts
    empty without a seed from the claimant (its home is the node that took the claim, or that
    node's backup, or the claimant when `keep`); `keep`, the claimant is the backup of the node
    that took the claim, which did not send it the record of the new directory's home: the
    claimant keeps that record itself (IndexRecords to itself, seeding the index if it is the home)."""

    holders: tuple[IndexHolder, ...]
    seeded: bool = False
    keep: bool = False


@dataclass(frozen=True)
class PartOk(Message, Generic[T]):
    """`index_part` served: the carried request's reply, and the partitions the server knows of."""

    wire_tag = "ok"
    result: T
    bitmap: tuple[int, ...]


@dataclass(frozen=True)
class PartRedirect(Message):
    """`index_part` refused: the name is in a partition the asked node does not serve. `bitmap`:
    the partitions it knows of; the asker merges them into its map and asks where that says."""

    wire_tag = "redirect"
    bitmap: tuple[int, ...]


class SyncEntry(NamedTuple):
    """One change `index_sync` tells a home: an entry new or changed on the sender, as its listing
    has it (a DirEntry), or with no attributes: gone from there."""

    name: Name
    attr: Attr | None
    replica_of: NodeName | None = None


class SplitEntry(NamedTuple):
    """One holder of a name of a partition handed to its new server: with its attributes (None: a
    claim whose file is not there yet), and the seconds since a claim or close told the home of
    it (None: not recent)."""

    name: Name
    node: NodeName
    is_dir: bool
    attr: Attr | None
    replica_of: NodeName | None
    age: float | None


@dataclass(frozen=True)
class SplitPayload(Message):
    """What `index_split` hands the server of a new partition: its names, the leases on them
    (seconds left, by asker) and what the splitting node knew of the directory (`missing`
    nodes, `exists`, the nodes holding it)."""

    home: NodeName
    bitmap: Bitmap
    partition: Partition
    entries: list[SplitEntry]
    missing: list[NodeName]
    exists: bool
    holders: list[NodeName]
    negatives: dict[Name, dict[NodeName, float]]
    listing_leases: dict[NodeName, float]
    child_homes: dict[Name, NodeName]
    home_leases: dict[Name, dict[NodeName, float]]


# --------------------------------------------------------------------------- requests


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
    directory: Pathname
    name: Name
    asker: NodeName | None = None
    with_listing: bool = False


@dataclass(frozen=True)
class IndexClaim(IndexNameRequest[IndexClaimReply]):
    """`node` is about to create `name` (see IndexClaimReply). `exclusive` False: a parent
    directory a create makes, recorded even when the name exists elsewhere."""

    op = "index_claim"
    directory: Pathname
    name: Name
    node: NodeName
    is_dir: bool = False
    exclusive: bool = True


@dataclass(frozen=True)
class IndexSet(IndexNameRequest[None]):
    """`node` holds `name` with `attr` (None: the home asks it); `asker` (default `node`) made the change."""

    op = "index_set"
    directory: Pathname
    name: Name
    node: NodeName
    attr: Attr | None
    replica_of: NodeName | None = None
    is_dir: bool = False
    asker: NodeName | None = None


@dataclass(frozen=True)
class IndexDrop(IndexNameRequest[list[str]]):
    """`name` is gone from `nodes` (None: from every node); `asker` removed it. A removed
    subdirectory's index is forgotten at its home (and at `index_home`, where the asker saw it
    homed) by the directory's home; the reply names the homes that did not answer (the asker
    owes them the forget). `keep`: the asker is the directory's backup and drops its copy of
    the subdirectory's record itself (no copy is sent to it)."""

    op = "index_drop"
    directory: Pathname
    name: Name
    nodes: list[NodeName] | None = None
    asker: NodeName | None = None
    index_home: NodeName | None = None
    keep: bool = False


@dataclass(frozen=True)
class IndexReplace(IndexNameRequest[None]):
    """After a rename to `name` (by `asker`): exactly `nodes` hold it."""

    op = "index_replace"
    directory: Pathname
    name: Name
    nodes: list[NodeName]
    is_dir: bool
    asker: NodeName | None = None


@dataclass(frozen=True)
class IndexRename(IndexNameRequest[None]):
    """A rename within `directory` (by `asker`): `src` is gone, exactly `nodes` hold `name`. One
    message for IndexDrop and IndexReplace at the same home; EXDEV when the two names are in
    partitions of a split directory that different nodes serve (send those two instead)."""

    op = "index_rename"
    directory: Pathname
    name: Name
    src: Name
    nodes: list[NodeName]
    is_dir: bool
    asker: NodeName | None = None


@dataclass(frozen=True)
class IndexList(Request[IndexListReply]):
    """The whole directory from its home, leased to `asker` (None: not leased)."""

    op = "index_list"
    directory: Pathname
    asker: NodeName | None = None


@dataclass(frozen=True)
class IndexSync(Request[None]):
    """`node`'s export changed outside the mount: `changes` are the entries of `directory` new or
    changed there, and the names gone (no attributes). `covered`: the partitions of a split
    directory the sender passed them on to."""

    op = "index_sync"
    directory: Pathname
    node: NodeName
    changes: list[SyncEntry]
    covered: Bitmap | None = None


@dataclass(frozen=True)
class IndexForget(Request[None]):
    """Build the indexes of the directories under `prefixes` again when next asked (`covered`: as
    for IndexSync)."""

    op = "index_forget"
    prefixes: list[Pathname]
    covered: Bitmap | None = None


@dataclass(frozen=True)
class IndexRecords(Request[dict[str, str]]):
    """The homes of `directory`'s subdirectories that its home keeps on the asked node, its backup:
    `updates` applied (a None home: removed), and then none returned; without `updates`, all of
    them. Name -> home. A removed subdirectory's index kept on the asked node goes too (the
    directory is gone: its home's backup is its likeliest other home). `seed`: the node that just made
    the new subdirectories in `updates`; those homed at the asked node start with an empty index
    there (IndexSeed, in the same message)."""

    op = "index_records"
    directory: Pathname
    updates: dict[Name, NodeName | None] | None = None
    seed: NodeName | None = None


@dataclass(frozen=True)
class IndexOwned(Request[None]):
    """The names `home` holds in `directory`, a directory it owns, copied to the asked node, its
    backup, in batches (a stand-in for `home` answers them as `home`'s): `changes` applied to the
    copy kept there (no attributes: gone), or, `whole`, the copy replaced by them (empty: none)."""

    op = "index_owned"
    directory: Pathname
    home: NodeName
    changes: list[SyncEntry]
    whole: bool = False


@dataclass(frozen=True)
class IndexSeed(Request[None]):
    """`directory` was just made on `node` by a mkdir through the mount: its index starts empty."""

    op = "index_seed"
    directory: Pathname
    node: NodeName | None = None


@dataclass(frozen=True)
class IndexAdopt(Request[None]):
    """`directory` appeared on `node` outside the mount: its home lists it there now."""

    op = "index_adopt"
    directory: Pathname
    node: NodeName


@dataclass(frozen=True)
class IndexSplit(Request[None]):
    """Serve the partition of `directory` the sender split off (`payload`)."""

    op = "index_split"
    directory: Pathname
    payload: SplitPayload


@dataclass(frozen=True)
class IndexParts(Request[None]):
    """A partition of `directory` split: the partitions known now (`bitmap`), for its `home`."""

    op = "index_parts"
    directory: Pathname
    home: NodeName
    bitmap: Bitmap


@dataclass(frozen=True)
class IndexListdir(Request[list[DirEntry] | None]):
    """The asked node's own entries of `directory` (as `listdir`; EFBIG: page with Opendir), for the
    directory's `home`: the node watches it from now on and tells `home` of changes made outside
    the mount (IndexSync)."""

    op = "index_listdir"
    directory: Pathname
    home: NodeName | None = None


@dataclass(frozen=True)
class IndexUnhome(Request[None]):
    """Revoked by a home: the directories under `prefixes` are gone or moved; forget their homes,
    listings and "not found" (`indexes`: and this node's own indexes of them)."""

    op = "index_unhome"
    prefixes: list[Pathname]
    indexes: bool = False


@dataclass(frozen=True)
class IndexUnlist(Request[None]):
    """Revoked by its home: the listing of `directory` changed."""

    op = "index_unlist"
    directory: Pathname


@dataclass(frozen=True)
class IndexBackup(Carrying[T]):
    """`request` served by a home's backup in place of `home`, which did not answer; the reply is
    `request`'s."""

    op = "index_backup"
    home: NodeName
    request: Request[T]


@dataclass(frozen=True)
class Recorded(Carrying[T]):
    """`request`, a change to a file the asked node holds (chmod, utimens, truncate or unlink),
    made there and then recorded by that node at `home`, the home `asker` knows for the file's
    directory, as a change `asker` made: from an asker far from the home, one round trip, with
    the record sent from the holder, nearer the home. The reply is `request`'s."""

    op = "recorded"
    home: NodeName
    asker: NodeName
    request: Request[T]


@dataclass(frozen=True)
class IndexPart(Carrying[PartOk[T] | PartRedirect]):
    """`request` at the server of `partition` of a split directory, by the asker's map of its
    partitions (`bitmap`) and its `home`. The reply: PartOk with the request's reply, or
    PartRedirect."""

    op = "index_part"
    partition: Partition
    home: NodeName
    bitmap: Bitmap
    request: Request[T]

    def reply_codec(self) -> Codec:
        return _part_codec(type(self.request))

    def decode(self, value: Any) -> PartOk[T] | PartRedirect:
        """A malformed `result` is the carried request's reply: the error names that request's op."""
        try:
            answer: PartOk[Any] | PartRedirect = codec(PartOk[Any] | PartRedirect).decode(value)
        except WireError as exc:
            raise malformed_reply(self.op, exc) from None
        if isinstance(answer, PartOk):
            return PartOk(self.request.decode(answer.result), answer.bitmap)
        return answer


def _part_codec(carried: type[Request[Any]]) -> Codec:
    found = _part_codecs.get(carried)
    if found is None:
        found = _part_codecs[carried] = codec(PartOk[carried.reply] | PartRedirect)  # type: ignore[name-defined]
    return found


_part_codecs: dict[type[Request[Any]], Codec] = {}
