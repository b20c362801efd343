"""Inode numbers for namespace paths, with the kernel's lookup counts.

The union has no inode numbers of its own (each node's disk has its own),
so the FUSE layer hands out numbers per path and keeps them while the
kernel knows them: every entry returned to the kernel counts one lookup,
`forget` takes them back, and at zero the number is freed. All methods are
synchronous, so an operation never changes the table half-way around an
`await`.
"""

from __future__ import annotations

ROOT_INODE = 1


class InodeTable:
    def __init__(self) -> None:
        self._paths: dict[int, str] = {ROOT_INODE: "/"}
        self._inodes: dict[str, int] = {"/": ROOT_INODE}
        self._lookups: dict[int, int] = {ROOT_INODE: 1}
        self._next = ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._paths)

    def path(self, inode: int) -> str:
        """The path an inode stands for; KeyError if the kernel used a forgotten inode."""
        return self._paths[inode]

    def inode(self, path: str) -> int | None:
        return self._inodes.get(path)

    def lookups(self, inode: int) -> int:
        return self._lookups.get(inode, 0)

    def peek(self, path: str) -> int:
        """The inode of `path`, allocated if new, without counting a lookup."""
        inode = self._inodes.get(path)
        if inode is None:
            inode = self._next
            self._next += 1
            self._inodes[path] = inode
            self._paths[inode] = path
            self._lookups[inode] = 0
        return inode

    def remember(self, path: str) -> int:
        """The inode of `path`, counting one lookup by the kernel."""
        inode = self.peek(path)
        self._lookups[inode] += 1
        return inode

    def drop_if_unused(self, inode: int) -> None:
        if inode != ROOT_INODE and self._lookups.get(inode) == 0:
            self._free(inode)

    def forget(self, inode: int, count: int) -> None:
        if inode == ROOT_INODE or inode not in self._lookups:
            return
        self._lookups[inode] -= count
        if self._lookups[inode] <= 0:
            self._free(inode)

    def _free(self, inode: int) -> None:
        path = self._paths.pop(inode)
        del self._lookups[inode]
        if self._inodes.get(path) == inode:
            del self._inodes[path]

    def detach(self, path: str) -> None:
        """The path is gone (unlink/rmdir): new lookups get a new inode; the old one lives until forgotten."""
        self._inodes.pop(path, None)

    def rename(self, src: str, dst: str, is_dir: bool = True) -> None:
        """Move `src` (and for a directory everything below it) to `dst`; what was at `dst` is detached.

        A directory rename scans the table; a file rename is O(1).
        """
        self.detach(dst)
        if not is_dir:
            inode = self._inodes.pop(src, None)
            if inode is not None:
                self._inodes[dst] = inode
                self._paths[inode] = dst
            return
        dst_prefix = dst + "/"
        for path in [p for p in self._inodes if p.startswith(dst_prefix)]:
            del self._inodes[path]
        src_prefix = src + "/"
        moved = [(p, i) for p, i in self._inodes.items() if p == src or p.startswith(src_prefix)]
        for path, _ in moved:
            del self._inodes[path]
        for path, inode in moved:
            new = dst + path[len(src):]
            self._inodes[new] = inode
            self._paths[inode] = new
