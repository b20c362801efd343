"""The attributes of a file as they travel between nodes."""

from __future__ import annotations

import os
import stat
from typing import NamedTuple


class Attr(NamedTuple):
    """The attributes of one file as they travel between nodes.

    `dev` and `ino` say which file of its holder's disk this is: `ino` is the holder's
    st_ino, `dev` the holder's st_dev -- or 0 when the file is on the file system of the
    holder's export directory (the common case), so that every node can tell those files
    apart from files on another file system mounted inside an export without knowing the
    holder's device numbers. The mount's inode numbers are made from them
    (`gmountpy.node.inodes.file_ino`).
    """

    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    blocks: int
    blksize: int
    rdev: int
    dev: int
    ino: int

    @classmethod
    def from_stat(cls, st: os.stat_result, export_dev: int | None = None) -> Attr:
        """The attributes of `st`, a stat of a file of the export whose root is on `export_dev`."""
        dev = 0 if st.st_dev == export_dev else st.st_dev
        return cls(st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size, st.st_atime_ns,
                   st.st_mtime_ns, st.st_ctime_ns, st.st_blocks, st.st_blksize, st.st_rdev, dev, st.st_ino)

    @classmethod
    def from_wire(cls, value: list[int] | tuple[int, ...]) -> Attr:
        if len(value) != len(cls._fields) or not all(isinstance(v, int) for v in value):
            raise ValueError(f"malformed attributes: {value!r}")
        return cls(*value)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    def same_file(self, other: Attr) -> bool:
        """Whether both are the attributes of one file of one holder (two hard links, or one name
        seen twice); only meaningful for attributes from the same node."""
        return (self.dev, self.ino) == (other.dev, other.ino) and self.ino != 0
