"""Inode numbers of the mount: the identity function, and the table against a model of the kernel and namespace."""

from __future__ import annotations

import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gmountpy.node.inodes import FILE_BITS, MAX_SLOT, ROOT_INODE, InodeTable, file_ino, holder_slots
from gmountpy.protocol.attr import Attr

NODES = ("n1", "n2", "n3")
SLOTS = holder_slots(NODES)


def attr(ino: int, *, is_dir: bool = False, nlink: int = 1, dev: int = 0) -> Attr:
    mode = (stat.S_IFDIR | 0o755) if is_dir else (stat.S_IFREG | 0o644)
    return Attr(mode, nlink, 0, 0, 0, 0, 0, 0, 0, 4096, 0, dev, ino)


def number(holder: str, ino: int, dev: int = 0) -> int:
    return file_ino(SLOTS[holder], dev, ino)


# ---------------------------------------------------------------- the identity function


def test_file_ino_puts_the_holders_slot_above_the_holders_inode_number() -> None:
    assert file_ino(1, 0, 12) == (1 << 48) + 12
    assert file_ino(MAX_SLOT, 0, 2**47 - 1) == 2**64 - 1 - 2**47
    # another file system inside an export: hashed into the upper half of the holder's range (pinned,
    # with the slots below, so that a reimplementation -- the local-file bypass -- can check itself)
    assert file_ino(1, 2049, 12) == 0x1_ABFB_9C53_6DCE
    assert holder_slots(["n1", "n2", "n3"]) == {"n1": 13001, "n2": 41046, "n3": 47987}
    hashed = file_ino(7, 2049, 12)
    assert hashed >> FILE_BITS == 7 and hashed & (1 << 47) and hashed == file_ino(7, 2049, 12)
    assert file_ino(7, 2049, 12) != file_ino(7, 2050, 12) != file_ino(7, 0, 12)
    assert file_ino(3, 0, 2**47) & (1 << 47)  # too big for the direct form: hashed
    for bad in (0, MAX_SLOT + 1):
        with pytest.raises(ValueError, match="slot"):
            file_ino(bad, 0, 1)


@given(st.integers(1, MAX_SLOT), st.integers(1, MAX_SLOT), st.integers(1, 2**47 - 1), st.integers(1, 2**47 - 1))
def test_files_of_different_holders_never_share_a_number(a: int, b: int, ino_a: int, ino_b: int) -> None:
    if a != b:
        assert file_ino(a, 0, ino_a) != file_ino(b, 0, ino_b)
        assert file_ino(a, 99, ino_a) != file_ino(b, 0, ino_b)
    assert (file_ino(a, 0, ino_a) == file_ino(a, 0, ino_b)) == (ino_a == ino_b)
    assert file_ino(a, 0, ino_a) > ROOT_INODE


def test_holder_slots_are_distinct_the_same_everywhere_and_stable_when_nodes_are_added() -> None:
    names = [f"node{i:03d}" for i in range(500)]
    slots = holder_slots(names)
    assert len(set(slots.values())) == 500 and all(1 <= s <= MAX_SLOT for s in slots.values())
    assert holder_slots(reversed(names)) == slots  # every node computes the same table
    grown = holder_slots([*names, "login", "gpu17"])
    moved = [n for n in names if grown[n] != slots[n]]
    assert len(moved) <= 2  # only a collision with a new name moves a slot


# ---------------------------------------------------------------- worked examples


def test_two_names_of_one_file_are_one_number_and_an_unlink_keeps_the_other() -> None:
    table = InodeTable(NODES)
    a = table.remember("/d/a", "n2", attr(40, nlink=2))
    b = table.remember("/d/b", "n2", attr(40, nlink=2))
    assert a == b == number("n2", 40) and table.lookups(a) == 2
    assert table.names(a) == ["/d/a", "/d/b"] and table.path(a) == "/d/b"
    table.detach("/d/b")
    assert table.path(a) == "/d/a" and table.inode("/d/b") is None
    table.forget(a, 2)
    assert len(table) == 1 and table.inode("/d/a") is None


def test_a_rename_keeps_the_number_and_a_relookup_after_forget_makes_it_again() -> None:
    table = InodeTable(NODES)
    f = table.remember("/f", "n1", attr(7))
    table.rename("/f", "/g", is_dir=False)
    assert table.inode("/g") == f and table.path(f) == "/g" and table.inode("/f") is None
    table.forget(f, 1)
    with pytest.raises(KeyError):
        table.path(f)
    assert table.remember("/g", "n1", attr(7)) == f == number("n1", 7)


def test_a_file_renamed_on_another_node_is_found_under_its_new_name_with_its_number() -> None:
    table = InodeTable(NODES)
    f = table.remember("/old", "n3", attr(9))
    assert table.remember("/new", "n3", attr(9)) == f  # one name only (nlink 1): it moved
    assert table.inode("/old") is None and table.names(f) == ["/new"]


def test_a_name_that_is_another_file_now_gets_that_files_number() -> None:
    table = InodeTable(NODES)
    old = table.remember("/f", "n1", attr(7))
    new = table.remember("/f", "n3", attr(7))  # replaced by n3's file of the same inode number
    assert new != old and new == number("n3", 7) and table.inode("/f") == new
    assert table.path(old) == "/f" and table.names(old) == []  # kept for the kernel until forgotten
    assert not table.is_file_of(old, "n3", attr(7)) and table.is_file_of(old, "n1", attr(7))


def test_a_merged_directory_keeps_the_number_it_was_first_looked_up_with() -> None:
    table = InodeTable(NODES)
    d = table.remember("/d", "n3", attr(30, is_dir=True))
    assert table.remember("/d", "n1", attr(31, is_dir=True)) == d  # n1 made its own copy meanwhile
    assert table.is_file_of(d, "n1", attr(31, is_dir=True))
    table.rename("/d", "/e")
    assert table.remember("/e", "n1", attr(31, is_dir=True)) == d


def test_a_directory_rename_moves_every_name_below_it_and_detaches_the_destination() -> None:
    table = InodeTable(NODES)
    a = table.remember("/a", "n1", attr(2, is_dir=True))
    ab = table.remember("/a/b", "n1", attr(3, is_dir=True))
    abc = table.remember("/a/b/c", "n1", attr(4))
    x = table.remember("/x", "n1", attr(5, is_dir=True))
    xy = table.remember("/x/y", "n1", attr(6))
    table.rename("/a", "/x", is_dir=True)
    assert (table.inode("/x"), table.inode("/x/b"), table.inode("/x/b/c")) == (a, ab, abc)
    assert table.inode("/a") is None and table.inode("/a/b") is None and table.path(abc) == "/x/b/c"
    assert table.path(x) == "/x" and table.path(xy) == "/x/y" and table.inode("/x/y") is None
    table.forget(x, 1)
    assert table.inode("/x") == a  # freeing the replaced one does not unmap the new one
    table.forget(xy, 1)
    assert len(table) == 4


def test_a_rename_of_a_prefix_sibling_is_not_a_descendant() -> None:
    table = InodeTable(NODES)
    ab = table.remember("/ab", "n1", attr(2))
    table.remember("/a", "n1", attr(3, is_dir=True))
    table.rename("/a", "/z", is_dir=True)
    assert table.inode("/ab") == ab and table.path(ab) == "/ab"


def test_a_hard_link_renamed_into_a_moved_directory_keeps_its_other_name() -> None:
    table = InodeTable(NODES)
    f = table.remember("/top", "n1", attr(8, nlink=2))
    table.remember("/d", "n1", attr(9, is_dir=True))
    assert table.remember("/d/f", "n1", attr(8, nlink=2)) == f
    table.rename("/d", "/e", is_dir=True)
    assert sorted(table.names(f)) == ["/e/f", "/top"]


def test_two_files_hashed_to_one_number_get_two_numbers() -> None:
    table = InodeTable(NODES)
    hashed = table.remember("/m/a", "n1", attr(5, dev=77))
    assert hashed == number("n1", 5, dev=77) and hashed & (1 << 47)
    table._inodes[hashed].identity = ("n1", 78, 9)  # as if another file had hashed to it first
    second = table.remember("/m/b", "n1", attr(5, dev=77))
    assert second != hashed and 1 < second < 1 << FILE_BITS  # a number of the table's own
    assert table.remember("/m/c", "n1", attr(5, dev=77)) == second  # kept for that file while known
    table.forget(second, 2)
    assert table.lookups(second) == 0 and table.inode("/m/c") is None


def test_a_holder_outside_the_cluster_file_gets_a_number_of_the_tables_own() -> None:
    table = InodeTable(NODES)
    inode = table.remember("/f", "stranger", attr(3))
    assert 1 < inode < 1 << FILE_BITS and table.remember("/f", "stranger", attr(3)) == inode


def test_peek_then_drop_if_unused() -> None:
    table = InodeTable(NODES)
    inode = table.peek("/p", "n1", attr(3))
    assert table.lookups(inode) == 0
    table.drop_if_unused(inode)
    assert table.inode("/p") is None
    inode = table.remember("/p", "n1", attr(3))
    table.drop_if_unused(inode)
    assert table.inode("/p") == inode


def test_root_survives_everything() -> None:
    table = InodeTable(NODES)
    table.forget(ROOT_INODE, 100)
    table.drop_if_unused(ROOT_INODE)
    assert table.remember("/", "n2", attr(2, is_dir=True)) == ROOT_INODE
    assert table.path(ROOT_INODE) == "/" and table.inode("/") == ROOT_INODE


def test_over_forgetting_frees_without_going_negative() -> None:
    table = InodeTable(NODES)
    inode = table.remember("/f", "n1", attr(3))
    table.forget(inode, 5)
    assert table.lookups(inode) == 0 and table.inode("/f") is None


# ---------------------------------------------------------------- the model

NAMES = ["a", "b"]
PATHS = sorted({"/" + "/".join(p) for p in
                [(x,) for x in NAMES] + [(x, y) for x in NAMES for y in NAMES]
                + [(x, y, z) for x in NAMES for y in NAMES for z in NAMES]})
#: The files of the world: (holder, ino) -> (is_dir, nlink). Two linked files, two single, two directories.
FILES = {("n1", 10): (False, 2), ("n2", 10): (False, 1), ("n1", 11): (False, 1), ("n3", 12): (False, 2),
         ("n1", 20): (True, 2), ("n2", 21): (True, 2)}


def below(path: str, ancestor: str) -> bool:
    return path.startswith(ancestor + "/")


class InodeTableMachine(RuleBasedStateMachine):
    """The model: which name has which number, each live number's names and lookup count."""

    def __init__(self) -> None:
        super().__init__()
        self.table = InodeTable(NODES)
        self.mapped: dict[str, int] = {"/": ROOT_INODE}
        self.names: dict[int, list[str]] = {ROOT_INODE: ["/"]}
        self.last: dict[int, str] = {ROOT_INODE: "/"}
        self.count: dict[int, int] = {ROOT_INODE: 1}
        self.is_dir: dict[int, bool] = {ROOT_INODE: True}
        self.identity: dict[int, tuple[str, int]] = {}

    @initialize()
    def start(self) -> None:
        assert len(self.table) == 1 and self.table.path(ROOT_INODE) == "/"

    def _unname(self, path: str) -> None:
        inode = self.mapped.pop(path, None)
        if inode is not None and path in self.names[inode]:
            self.names[inode].remove(path)

    def _name(self, inode: int, path: str) -> None:
        if path in self.names[inode]:
            self.names[inode].remove(path)
        self.names[inode].append(path)
        self.last[inode] = path
        self.mapped[path] = inode

    # -- the kernel -------------------------------------------------------

    def _take(self, path: str, key: tuple[str, int], counted: bool) -> None:
        is_dir, nlink = FILES[key]
        found = attr(key[1], is_dir=is_dir, nlink=nlink)
        inode = self.table.remember(path, key[0], found) if counted else self.table.peek(path, key[0], found)
        current = self.mapped.get(path)
        if current is not None and (self.identity.get(current) == key or (self.is_dir[current] and is_dir)):
            assert inode == current, "a name keeps its file's number (a merged directory its first)"
        else:
            assert inode == number(*key), "a file's number is made from its holder and inode number"
            if current is not None:
                self._unname(path)
            if inode in self.count:
                if is_dir or nlink <= 1:
                    for old in list(self.names[inode]):
                        self._unname(old)
            else:
                self.count[inode], self.names[inode] = 0, []
                self.is_dir[inode], self.identity[inode] = is_dir, key
        self._name(inode, path)
        if counted:
            self.count[inode] += 1

    @rule(path=st.sampled_from(PATHS), key=st.sampled_from(sorted(FILES)))
    def remember(self, path: str, key: tuple[str, int]) -> None:
        self._take(path, key, counted=True)

    @rule(path=st.sampled_from(PATHS), key=st.sampled_from(sorted(FILES)))
    def peek(self, path: str, key: tuple[str, int]) -> None:
        self._take(path, key, counted=False)

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

    @rule(n=st.integers(min_value=1, max_value=3), key=st.sampled_from(sorted(FILES)))
    def forget_unknown_is_harmless(self, n: int, key: tuple[str, int]) -> None:
        if number(*key) not in self.count:
            self.table.forget(number(*key), n)

    @precondition(lambda self: len(self.count) > 1)
    @rule(data=st.data())
    def drop_if_unused(self, data: st.DataObject) -> None:
        inode = data.draw(st.sampled_from(sorted(self.count)))
        self.table.drop_if_unused(inode)
        if inode != ROOT_INODE and self.count[inode] == 0:
            self._free(inode)

    def _free(self, inode: int) -> None:
        for path in self.names.pop(inode):
            if self.mapped.get(path) == inode:
                del self.mapped[path]
        del self.count[inode], self.is_dir[inode], self.identity[inode], self.last[inode]

    # -- the namespace ----------------------------------------------------

    @rule(path=st.sampled_from(PATHS))
    def detach(self, path: str) -> None:
        """unlink/rmdir: the name goes, the number lives on until the kernel forgets it."""
        self.table.detach(path)
        self._unname(path)

    @rule(src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS), is_dir=st.booleans())
    def rename(self, src: str, dst: str, is_dir: bool) -> None:
        # What rename(2) itself refuses never reaches the table.
        if src == dst or below(dst, src) or below(src, dst):
            return
        if not is_dir and any(below(p, src) for p in self.mapped):
            return  # a file has nothing below it
        self.table.rename(src, dst, is_dir)
        self._unname(dst)
        if is_dir:
            for path in [p for p in self.mapped if below(p, dst)]:
                self._unname(path)
        moved = [(p, i) for p, i in self.mapped.items() if p == src or (is_dir and below(p, src))]
        for path, _ in moved:
            self._unname(path)
        for path, inode in moved:
            self._name(inode, dst + path[len(src):])

    # -- invariants -----------------------------------------------------------

    @invariant()
    def names_and_numbers_agree(self) -> None:
        for path, inode in self.mapped.items():
            assert self.table.inode(path) == inode, path
            assert path in self.table.names(inode), (path, inode)

    @invariant()
    def live_numbers_match_the_model(self) -> None:
        assert len(self.table) == len(self.count)
        for inode, count in self.count.items():
            assert sorted(self.table.names(inode)) == sorted(self.names[inode]), inode
            assert self.table.path(inode) == (self.names[inode][-1] if self.names[inode] else self.last[inode])
            assert self.table.lookups(inode) == count >= 0

    @invariant()
    def root_is_never_freed(self) -> None:
        assert self.table.inode("/") == ROOT_INODE
        assert self.table.path(ROOT_INODE) == "/"
        assert self.table.lookups(ROOT_INODE) >= 1

    @invariant()
    def freed_numbers_are_unknown(self) -> None:
        for key in FILES:
            inode = number(*key)
            if inode not in self.count:
                with pytest.raises(KeyError):
                    self.table.path(inode)
                assert self.table.lookups(inode) == 0 and self.table.names(inode) == []


InodeTableMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestInodeTable = InodeTableMachine.TestCase
