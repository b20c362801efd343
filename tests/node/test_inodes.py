"""The inode table against a model of what the kernel and the namespace do to it."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gmountpy.node.inodes import ROOT_INODE, InodeTable

NAMES = ["a", "b", "c"]
# Every path of depth 1..3 over three names: enough for renames to collide and to move subtrees.
PATHS = sorted({"/" + "/".join(p) for p in
                [(x,) for x in NAMES] + [(x, y) for x in NAMES for y in NAMES]
                + [(x, y, z) for x in NAMES for y in NAMES for z in NAMES]})


def below(path: str, ancestor: str) -> bool:
    return path.startswith(ancestor + "/")


class InodeTableMachine(RuleBasedStateMachine):
    """The model: which path maps to which inode, and each live inode's path and lookup count."""

    def __init__(self) -> None:
        super().__init__()
        self.table = InodeTable()
        self.mapped: dict[str, int] = {"/": ROOT_INODE}
        self.path_of: dict[int, str] = {ROOT_INODE: "/"}
        self.count: dict[int, int] = {ROOT_INODE: 1}
        self.issued: set[int] = {ROOT_INODE}

    @initialize()
    def start(self) -> None:
        assert len(self.table) == 1 and self.table.path(ROOT_INODE) == "/"

    # -- the kernel -------------------------------------------------------

    def _take(self, path: str, counted: bool) -> None:
        known = self.mapped.get(path)
        inode = self.table.remember(path) if counted else self.table.peek(path)
        if known is not None:
            assert inode == known
        else:
            assert inode not in self.issued, f"inode {inode} reused"
            self.issued.add(inode)
            self.mapped[path] = inode
            self.path_of[inode] = path
            self.count[inode] = 0
        if counted:
            self.count[inode] += 1

    @rule(path=st.sampled_from(PATHS))
    def remember(self, path: str) -> None:
        self._take(path, counted=True)

    @rule(path=st.sampled_from(PATHS))
    def peek(self, path: str) -> None:
        self._take(path, counted=False)

    @precondition(lambda self: len(self.count) > 1)
    @rule(data=st.data(), n=st.integers(min_value=1, max_value=3))
    def forget(self, data: st.DataObject, n: int) -> None:
        inode = data.draw(st.sampled_from(sorted(self.count)))
        self.table.forget(inode, n)
        if inode == ROOT_INODE:
            return
        self.count[inode] -= n
        if self.count[inode] <= 0:
            self._free(inode)

    @rule(inode=st.integers(min_value=1, max_value=40), n=st.integers(min_value=1, max_value=3))
    def forget_unknown_is_harmless(self, inode: int, n: int) -> None:
        if inode not in self.count:
            self.table.forget(inode, n)

    @precondition(lambda self: len(self.count) > 1)
    @rule(data=st.data())
    def drop_if_unused(self, data: st.DataObject) -> None:
        inode = data.draw(st.sampled_from(sorted(self.count)))
        self.table.drop_if_unused(inode)
        if inode != ROOT_INODE and self.count[inode] == 0:
            self._free(inode)

    def _free(self, inode: int) -> None:
        path = self.path_of.pop(inode)
        del self.count[inode]
        if self.mapped.get(path) == inode:
            del self.mapped[path]

    # -- the namespace ----------------------------------------------------

    @rule(path=st.sampled_from(PATHS))
    def detach(self, path: str) -> None:
        """unlink/rmdir: the name goes, the inode lives on until the kernel forgets it."""
        self.table.detach(path)
        self.mapped.pop(path, None)

    @rule(src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS), is_dir=st.booleans())
    def rename(self, src: str, dst: str, is_dir: bool) -> None:
        # What rename(2) itself refuses never reaches the table.
        if src == dst or below(dst, src) or below(src, dst):
            return
        if not is_dir and any(below(p, src) for p in self.mapped):
            return  # a file has nothing below it
        self.table.rename(src, dst, is_dir)
        for path in [p for p in self.mapped if p == dst or (is_dir and below(p, dst))]:
            del self.mapped[path]
        moved = [(p, i) for p, i in self.mapped.items() if p == src or (is_dir and below(p, src))]
        for path, _ in moved:
            del self.mapped[path]
        for path, inode in moved:
            new = dst + path[len(src):]
            self.mapped[new] = inode
            self.path_of[inode] = new

    # -- invariants -----------------------------------------------------------

    @invariant()
    def paths_and_inodes_agree(self) -> None:
        for path, inode in self.mapped.items():
            assert self.table.inode(path) == inode, path
            assert self.table.path(inode) == path, inode

    @invariant()
    def live_inodes_match_the_model(self) -> None:
        assert len(self.table) == len(self.count)
        for inode, count in self.count.items():
            assert self.table.path(inode) == self.path_of[inode]
            assert self.table.lookups(inode) == count >= 0

    @invariant()
    def root_is_never_freed(self) -> None:
        assert self.table.inode("/") == ROOT_INODE
        assert self.table.path(ROOT_INODE) == "/"
        assert self.table.lookups(ROOT_INODE) >= 1

    @invariant()
    def freed_inodes_are_unknown(self) -> None:
        for inode in self.issued - set(self.count):
            with pytest.raises(KeyError):
                self.table.path(inode)
            assert self.table.lookups(inode) == 0


InodeTableMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestInodeTable = InodeTableMachine.TestCase


# ---------------------------------------------------------------- worked examples


def test_rename_moves_descendants_and_detaches_the_destination() -> None:
    table = InodeTable()
    a, ab, abc = table.remember("/a"), table.remember("/a/b"), table.remember("/a/b/c")
    x, xy = table.remember("/x"), table.remember("/x/y")
    table.rename("/a", "/x", is_dir=True)
    assert (table.inode("/x"), table.inode("/x/b"), table.inode("/x/b/c")) == (a, ab, abc)
    assert table.inode("/a") is None and table.inode("/a/b") is None
    assert table.path(abc) == "/x/b/c"
    # The replaced directory and its child live on (the kernel may still use them) but have no name.
    assert table.path(x) == "/x" and table.path(xy) == "/x/y"
    assert table.inode("/x/y") is None
    table.forget(x, 1)
    assert table.inode("/x") == a  # freeing the old one does not unmap the new one
    table.forget(xy, 1)
    assert len(table) == 4


def test_rename_of_a_prefix_sibling_is_not_a_descendant() -> None:
    table = InodeTable()
    ab = table.remember("/ab")
    table.remember("/a")
    table.rename("/a", "/z", is_dir=True)
    assert table.inode("/ab") == ab and table.path(ab) == "/ab"


def test_detached_inode_survives_until_forgotten_and_a_new_lookup_gets_a_new_number() -> None:
    table = InodeTable()
    old = table.remember("/f")
    table.detach("/f")
    new = table.remember("/f")
    assert new != old and table.path(old) == "/f"
    table.forget(old, 1)
    assert table.inode("/f") == new
    with pytest.raises(KeyError):
        table.path(old)


def test_peek_then_drop_if_unused() -> None:
    table = InodeTable()
    inode = table.peek("/p")
    assert table.lookups(inode) == 0
    table.drop_if_unused(inode)
    assert table.inode("/p") is None
    inode = table.remember("/p")
    table.drop_if_unused(inode)
    assert table.inode("/p") == inode


def test_root_survives_everything() -> None:
    table = InodeTable()
    table.forget(ROOT_INODE, 100)
    table.drop_if_unused(ROOT_INODE)
    assert table.path(ROOT_INODE) == "/" and table.inode("/") == ROOT_INODE


def test_over_forgetting_frees_without_going_negative() -> None:
    table = InodeTable()
    inode = table.remember("/f")
    table.forget(inode, 5)
    assert table.lookups(inode) == 0 and table.inode("/f") is None
