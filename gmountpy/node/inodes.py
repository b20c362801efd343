"""Inode numbers of the mount: one per file, the same on every node, with the kernel's lookup counts.

A file's number is made from its identity -- the node that holds it and that node's own
device and inode number of it (`Attr.dev`, `Attr.ino`) -- by `file_ino`, a pure function:
so a file keeps its number across renames, all its hard links share it, and every node
shows the same number for it (tools that compare `st_ino`, such as `rsync -H`, `tar`,
`du`, `cp -a`, `find -samefile` and git's index, see one file). It is also the number the
kernel knows the file by (FUSE's node id is the attributes' st_ino), so the kernel treats
two names of a file as hard links of one inode.

    st_ino = slot(holder) << 48 | ino                     (dev 0: the export's own file system,
                                                            and ino < 2**47: every ext4, xfs, btrfs
                                                            file system in practice)
    st_ino = slot(holder) << 48 | 2**47 | hash(dev, ino)  (a file system mounted inside an export)

`slot` (1..65535) comes from the node's name (`holder_slots`), so numbers of different
holders never collide, and a number changes only when the node set does in a way that
moves that node's slot (a new node whose name hashes to the same slot and sorts first).
The second form can collide, with odds of about n**2 / 2**48 for n such files: the table
notices a collision among the numbers the kernel knows and gives the second file a
number of its own (slot 0: below 2**48, counted from 2 by this node, so not the same on
other nodes).

What is not a single file of one holder:
- the root is 1, as FUSE requires;
- a directory that exists on several nodes (a merged directory) takes the number of the
  copy it was first looked up on here -- the nearest one -- and keeps it while the kernel
  knows it, whichever copy answers later: a directory's number must not change under a
  process that works in it;
- a staged replica is a different file (its own node, its own inode): on the node that
  serves it, it shows its own number; elsewhere the source's.

All methods are synchronous, so an operation never changes the table half-way around an
`await`. The kernel counts lookups per number: every entry returned to it counts one,
`forget` takes them back, and at zero the number is no longer bound to any name here (a
later lookup of the same file makes the same number again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..protocol.attr import Attr

ROOT_INODE = 1
#: Bits of an inode number below the holder's slot.
FILE_BITS = 48
#: Slots 1..MAX_SLOT name holders; slot 0 holds the root and numbers the table hands out itself.
MAX_SLOT = (1 << (64 - FILE_BITS)) - 1
#: Numbers for files of another file system mounted inside an export are hashed into this half.
_HASHED = 1 << (FILE_BITS - 1)

#: (holder, dev, ino): one file of one node's disk (`Attr.dev` is 0 for the export's own file system).
Identity = tuple[str, int, int]


def _digest(data: bytes, bits: int) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") & ((1 << bits) - 1)


def holder_slots(nodes: Iterable[str]) -> dict[str, int]:
    """Each node's slot (1..MAX_SLOT): a hash of its name; nodes whose hashes collide take the
    next free slot, in the order of their names, so every node computes the same table."""
    slots: dict[str, int] = {}
    taken: set[int] = set()
    names = sorted(set(nodes))
    if len(names) > MAX_SLOT:
        raise ValueError(f"at most {MAX_SLOT} nodes have inode numbers of their own, not {len(names)}")
    for name in names:
        slot = _digest(name.encode(), 64) % MAX_SLOT + 1
        while slot in taken:
            slot = slot % MAX_SLOT + 1
        taken.add(slot)
        slots[name] = slot
    return slots


def file_ino(slot: int, dev: int, ino: int) -> int:
    """The mount's inode number of the file `ino` on device `dev` (0: the export's own file system)
    of the holder with `slot`: the same on every node, for every name of the file.

    A program that reads a file of this node's export directly (not through the mount) shows the
    mount's number with `file_ino(slot, 0 if st.st_dev == export_st_dev else st.st_dev, st.st_ino)`,
    `slot` being `holder_slots(cluster nodes)[this node]`.
    """
    if not 1 <= slot <= MAX_SLOT:
        raise ValueError(f"slot must be within 1..{MAX_SLOT}, not {slot}")
    if dev == 0 and 0 < ino < _HASHED:
        return slot << FILE_BITS | ino
    return slot << FILE_BITS | _HASHED | _digest(f"{dev}:{ino}".encode(), FILE_BITS - 1)


@dataclass
class _Inode:
    """One number the kernel may know: which file it stands for and the names it has here."""

    identity: Identity | None    # None: the root
    is_dir: bool
    names: list[str] = field(default_factory=list)  # live names, most recently used last
    last: str = "/"              # its last name: an unlinked file open somewhere still has a path
    lookups: int = 0


class InodeTable:
    """Numbers by identity, names by path: `path` is how an operation on a number reaches its file."""

    def __init__(self, nodes: Iterable[str] = ()) -> None:
        self._slots = holder_slots(nodes)
        self._inodes: dict[int, _Inode] = {ROOT_INODE: _Inode(None, True, ["/"], "/", 1)}
        self._by_path: dict[str, int] = {"/": ROOT_INODE}
        self._own: dict[Identity, int] = {}  # files given a number of the table's own (a collision)
        self._next_own = ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._inodes)

    def path(self, inode: int) -> str:
        """A name of the file (its most recently used); KeyError if the kernel used a forgotten inode."""
        node = self._inodes[inode]
        return node.names[-1] if node.names else node.last

    def names(self, inode: int) -> list[str]:
        """Every name the table knows the file by (hard links looked up here), most recent last."""
        node = self._inodes.get(inode)
        return list(node.names) if node is not None else []

    def inode(self, path: str) -> int | None:
        return self._by_path.get(path)

    def lookups(self, inode: int) -> int:
        node = self._inodes.get(inode)
        return node.lookups if node is not None else 0

    def identity(self, inode: int) -> Identity | None:
        node = self._inodes.get(inode)
        return node.identity if node is not None else None

    def is_file_of(self, inode: int, holder: str, attr: Attr) -> bool:
        """Whether `attr`, found on `holder`, is of the file `inode` stands for (a merged directory
        stands for any copy of it)."""
        node = self._inodes.get(inode)
        if node is None:
            return False
        return node.identity is None or (node.is_dir and attr.is_dir) or node.identity == (holder, attr.dev, attr.ino)

    def peek(self, path: str, holder: str, attr: Attr) -> int:
        """The number of the file at `path` (found on `holder` with `attr`), without counting a lookup."""
        if path == "/":
            return ROOT_INODE
        identity = (holder, attr.dev, attr.ino)
        current = self._by_path.get(path)
        if current is not None:
            node = self._inodes[current]
            if node.identity == identity or (node.is_dir and attr.is_dir):
                self._name(current, path)
                return current
            self._unname(path)  # another file has this name now
        inode = self._number(identity)
        known = self._inodes.get(inode)
        if known is None:
            self._inodes[inode] = _Inode(identity, attr.is_dir)
        elif attr.is_dir or attr.nlink <= 1:
            for old in list(known.names):  # one name only: it moved (renamed on another node)
                self._unname(old)
        self._name(inode, path)
        return inode

    def remember(self, path: str, holder: str, attr: Attr) -> int:
        """The number of the file at `path`, counting one lookup by the kernel."""
        inode = self.peek(path, holder, attr)
        self.count_lookup(inode)
        return inode

    def count_lookup(self, inode: int) -> None:
        """The kernel took an entry `peek` numbered (a listing's entry it accepted)."""
        self._inodes[inode].lookups += 1

    def drop_if_unused(self, inode: int) -> None:
        node = self._inodes.get(inode)
        if inode != ROOT_INODE and node is not None and node.lookups == 0:
            self._free(inode)

    def forget(self, inode: int, count: int) -> None:
        node = self._inodes.get(inode)
        if inode == ROOT_INODE or node is None:
            return
        node.lookups -= count
        if node.lookups <= 0:
            self._free(inode)

    def detach(self, path: str, inode: int | None = None) -> None:
        """The name is gone (unlink/rmdir) -- or, with `inode`, is no longer that file's (if it still
        was): the file keeps its other names; its number lives until forgotten."""
        if inode is None or self._by_path.get(path) == inode:
            self._unname(path)

    def rename(self, src: str, dst: str, is_dir: bool = True) -> None:
        """Move `src` (and for a directory every name below it) to `dst`; what was at `dst` loses that name.

        A directory rename scans the table; a file rename is O(1).
        """
        self._unname(dst)
        if is_dir:
            dst_prefix = dst + "/"
            for path in [p for p in self._by_path if p.startswith(dst_prefix)]:
                self._unname(path)
            src_prefix = src + "/"
            moved = [(p, i) for p, i in self._by_path.items() if p == src or p.startswith(src_prefix)]
        else:
            inode = self._by_path.get(src)
            moved = [] if inode is None else [(src, inode)]
        for path, _ in moved:
            self._unname(path)
        for path, inode in moved:
            self._name(inode, dst + path[len(src):])

    # -- inside ------------------------------------------------------------------

    def _number(self, identity: Identity) -> int:
        own = self._own.get(identity)
        if own is not None:
            return own
        slot = self._slots.get(identity[0])
        if slot is not None:
            inode = file_ino(slot, identity[1], identity[2])
            node = self._inodes.get(inode)
            if node is None or node.identity == identity:
                return inode
        # a holder without a slot (not in the cluster file), or two files hashed to one number
        inode = self._next_own
        self._next_own += 1
        self._own[identity] = inode
        return inode

    def _name(self, inode: int, path: str) -> None:
        node = self._inodes[inode]
        if path in node.names:
            node.names.remove(path)
        node.names.append(path)
        node.last = path
        self._by_path[path] = inode

    def _unname(self, path: str) -> None:
        inode = self._by_path.pop(path, None)
        if inode is not None:
            names = self._inodes[inode].names
            if path in names:
                names.remove(path)

    def _free(self, inode: int) -> None:
        node = self._inodes.pop(inode)
        for path in node.names:
            if self._by_path.get(path) == inode:
                del self._by_path[path]
        if node.identity is not None and self._own.get(node.identity) == inode:
            del self._own[node.identity]
