"""The attributes of a file as they travel between nodes."""

from __future__ import annotations

import os
import stat
from typing import NamedTuple


class Attr(NamedTuple):
    """The attributes of one file as they travel between nodes."""

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

    @classmethod
    def from_stat(cls, st: os.stat_result) -> Attr:
        return cls(st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size, st.st_atime_ns,
                   st.st_mtime_ns, st.st_ctime_ns, st.st_blocks, st.st_blksize, st.st_rdev)

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
